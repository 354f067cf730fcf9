"""The dependency-free fallback server (:mod:`diloco_gym.live.server`)."""

from __future__ import annotations

import threading

import pytest

from diloco_gym.live.replay import (
    Endpoint,
    post_completion,
    probe_endpoint,
)
from diloco_gym.live.server import SidecarHTTPServer, SidecarModelConfig, TinyLM

pytest.importorskip("torch")


def test_builtin_server_is_quiet_about_clients_that_went_away(capsys):
    """A stopped calibration leaves requests in flight; the sidecar's write to their closed
    sockets printed a BrokenPipeError traceback. Other errors still print."""
    server = SidecarHTTPServer(TinyLM(SidecarModelConfig(d_model=16, hidden=16, n_layers=1)))
    try:
        for exc in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise exc
            except ConnectionError:
                server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a real bug")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a real bug" in capsys.readouterr().err
    finally:
        server.server_close()


def test_builtin_server_speaks_openai(tmp_path):
    lm = TinyLM(SidecarModelConfig(d_model=32, hidden=64, n_layers=2))
    server = SidecarHTTPServer(lm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        ep = Endpoint.parse(server.url + "/v1")
        assert probe_endpoint(server.url)["models"] == ["tiny-lm"]
        status, body, err = post_completion(ep, "tiny-lm", "a b c", 5, 5.0)
        assert (status, err) == (200, "")
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
        again = post_completion(ep, "tiny-lm", "a b c", 5, 5.0)[1]
        assert again["choices"][0]["text"] == body["choices"][0]["text"]  # greedy, seeded
        assert post_completion(ep, "other", "a", 1, 5.0)[0] == 404
        assert post_completion(ep, "tiny-lm", "a", 0, 5.0)[0] == 400
    finally:
        server.shutdown()
        server.server_close()
