"""Profile-guided quantization (Glow's): profile a model's tensors on calibration data,
then compile it with integer types chosen from the profile.

    profile.py       the profile: per-tensor range and histogram, as JSON, tied to its model
    profiler.py      runs the instrumented model natively on the calibration samples
    bodies.py        the tensors inside branches and loop bodies, and their instruments
    calibration.py   a tensor's range (minmax, percentile, kl) -> scale and offset (schemas)
    samples.py       calibration data from .npz files
"""
from .calibration import SCHEMAS, Calibration, choose_params, tensor_range
from .profile import Profile, TensorProfile, load_profile, model_fingerprint
from .profiler import DEFAULT_BINS, profile

__all__ = ["Profile", "TensorProfile", "profile", "load_profile", "model_fingerprint",
           "Calibration", "SCHEMAS", "choose_params", "tensor_range", "DEFAULT_BINS"]
