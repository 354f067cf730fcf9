"""``python -m diloco_gym.eval.calibration``: print the fitted sidecar parameters per
regime (a maintenance command)."""

from diloco_gym.eval.calibration.transfer import main

if __name__ == "__main__":  # pragma: no cover
    main()
