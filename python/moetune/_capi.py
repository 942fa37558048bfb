"""_capi.py: libmoetune's C API (include/moetune/) through ctypes: finding and
loading the shared library, the structs and prototypes, and turning a
failed status into a MoetuneError carrying moetune_errmsg's message.

Nothing here is compiled: the binding is this file and the library."""
import ctypes
import ctypes.util
import os

API_VERSION = 1  # the MOETUNE_API_VERSION this binding was written for


class MoetuneError(RuntimeError):
    """A failed libmoetune call: .status (int), .status_name, and the message."""

    def __init__(self, status, name, message):
        super().__init__(f"{name}: {message}")
        self.status = status
        self.status_name = name


def _library_path():
    env = os.environ.get("MOETUNE_LIBRARY")
    if env:
        return env
    # Installed: <prefix>/lib/python3/dist-packages/moetune -> <prefix>/lib
    here = os.path.dirname(os.path.abspath(__file__))
    near = os.path.join(here, "..", "..", "..", "libmoetune.so.1")
    if os.path.exists(near):
        return near
    return ctypes.util.find_library("moetune") or "libmoetune.so.1"


lib = ctypes.CDLL(_library_path())

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class DeviceInfo(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("spec", ctypes.c_char * 32),
                ("arch", ctypes.c_char * 32), ("name", ctypes.c_char * 128),
                ("compute_units", ctypes.c_int), ("host_memory", ctypes.c_int)]


class MoeDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint), ("hidden", ctypes.c_int64),
                ("inter", ctypes.c_int64), ("experts", ctypes.c_int64),
                ("topk", ctypes.c_int), ("n_group", ctypes.c_int),
                ("topk_group", ctypes.c_int), ("norm_topk", ctypes.c_int),
                ("routed_scale", ctypes.c_float), ("act", ctypes.c_int),
                ("weight_type", ctypes.c_int), ("routing", ctypes.c_int),
                ("shared_inter", ctypes.c_int64), ("max_tokens", ctypes.c_int64)]


WEIGHT_FIELDS = ("gate", "bias", "w13", "s13", "w2", "s2",
                 "shared_w13", "shared_s13", "shared_w2", "shared_s2")


class MoeWeights(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in WEIGHT_FIELDS]


class Selection(ctypes.Structure):
    _fields_ = [("kernel", ctypes.c_char_p), ("use", ctypes.c_char_p),
                ("shape", ctypes.c_char_p), ("config", ctypes.c_char_p),
                ("db", ctypes.c_char_p), ("note", ctypes.c_char_p),
                ("m", ctypes.c_int64), ("tuned_m", ctypes.c_int64),
                ("source", ctypes.c_int), ("is_default", ctypes.c_int)]


ACT = {"a16w4": 0, "a4w4": 1, "a8w4": 2}
ROUTING = {"gate": 0, "logits": 1, "topk": 2}
BACKENDS = ("cpu", "emu", "hip", "cuda")

_vp, _cp, _i64, _int = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int
_PROTOS = {
    "moetune_version": (_int, []),
    "moetune_version_string": (_cp, []),
    "moetune_status_str": (_cp, [_int]),
    "moetune_source_str": (_cp, [_int]),
    "moetune_errmsg": (_cp, [_vp]),
    "moetune_errcode": (_int, [_vp]),
    "moetune_device_open": (_int, [_cp, ctypes.POINTER(_vp)]),
    "moetune_device_close": (None, [_vp]),
    "moetune_device_add_db": (_int, [_vp, _cp]),
    "moetune_device_db_count": (_int, [_vp]),
    "moetune_device_get_info": (_int, [_vp, ctypes.POINTER(DeviceInfo)]),
    "moetune_device_synchronize": (_int, [_vp]),
    "moetune_moe_desc_init": (None, [ctypes.POINTER(MoeDesc)]),
    "moetune_moe_create": (_int, [_vp, ctypes.POINTER(MoeDesc), ctypes.POINTER(MoeWeights),
                                  ctypes.POINTER(_vp)]),
    "moetune_moe_destroy": (None, [_vp]),
    "moetune_moe_run": (_int, [_vp, _vp, _i64, _vp, _vp]),
    "moetune_moe_run_logits": (_int, [_vp, _vp, _vp, _i64, _vp, _vp]),
    "moetune_moe_run_topk": (_int, [_vp, _vp, _vp, _vp, _i64, _vp, _vp]),
    "moetune_moe_selection_count": (_int, [_vp]),
    "moetune_moe_selection": (_int, [_vp, _int, ctypes.POINTER(Selection)]),
    "moetune_moe_report": (_cp, [_vp]),
}
for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args

if lib.moetune_version() < API_VERSION:
    raise ImportError(f"libmoetune ({_library_path()}) implements API version "
                      f"{lib.moetune_version()}, this binding needs {API_VERSION}")


def check(status, device_handle):
    """Raises MoetuneError for a failed status, with the device's message."""
    if status != 0:
        name = lib.moetune_status_str(status).decode()
        raise MoetuneError(status, name, lib.moetune_errmsg(device_handle).decode())


def address(obj):
    """The address a buffer argument stands for: None, an int, a tensor
    (data_ptr()), a numpy array (.ctypes.data) or a ctypes object."""
    if obj is None:
        return None
    if isinstance(obj, int):
        return obj
    if hasattr(obj, "data_ptr"):
        return obj.data_ptr()
    if hasattr(obj, "ctypes") and hasattr(obj.ctypes, "data"):
        return obj.ctypes.data
    return ctypes.addressof(obj)
