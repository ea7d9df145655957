"""Reading a PyTorch repro dump's tensors without inventing any: the reader the dump's own
``load_args`` calls, which records per storage whether PyTorch saved data for it and turns an
input without data into an ``AbsentTensor`` (PyTorch's own reader would make random data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reproarchive.codec.devices import is_available
from reproarchive.compat.tensor_internals import set_tensor_metadata


class _Storage:
    """One ``reader.storage(...)`` call: where its data is, or why there is none."""

    def __init__(self, index: int, digest: str | None, nbytes: int, device: Any, dtype_hint: Any):
        self.name = f"buf{index}"
        self.digest = digest
        self.nbytes = nbytes
        self.device = device
        self.dtype_hint = dtype_hint
        self.status = "no_data"  # real | no_data | missing | no_store | unreadable
        self.error: str | None = None
        self.data = None  # torch.UntypedStorage when real
        self.loaded_on: str | None = None

    @property
    def file(self) -> str | None:
        return f"storages/{self.digest}" if self.digest else None


class _GuardedArgs(list):
    """``reader.args`` as the dump's own fix-up code sees it.

    after_aot scripts rewrite ``reader.args[i]`` in place (the repeat_interleave fix-up, meant for
    random data); handing out clones keeps the real data we load bit-exact.
    """

    def __getitem__(self, index):  # type: ignore[override]
        import torch

        value = super().__getitem__(index)
        return value.clone() if isinstance(value, torch.Tensor) else value


class RecordingReader:
    """A drop-in for ``torch._dynamo.debug_utils.InputReader`` that never makes data up.

    Same call signatures (load_args format version 0). A storage whose data file exists is
    loaded (``torch.load(weights_only=True)``, the dump's own content store); any other storage
    yields inputs described as ``AbsentTensor``. ``inputs`` holds one entry per load_args input
    with what we know about it, for the report.
    """

    def __init__(self, store_dir: Path | None):
        self.store_dir = store_dir
        self.storages: list[_Storage] = []
        self.inputs: list[dict[str, Any]] = []
        self._args: list[Any] = []

    @property
    def args(self) -> list[Any]:
        return _GuardedArgs(self._args)

    # -- the load_args DSL ------------------------------------------------------------------

    def storage(self, storage_hash, nbytes, *, device=None, dtype_hint=None):
        import torch

        device = torch.device(device) if device is not None else torch.device("cpu")
        dtype_hint = dtype_hint if dtype_hint is not None else torch.float32
        rec = _Storage(len(self.storages), storage_hash, int(nbytes), device, dtype_hint)
        self.storages.append(rec)
        if storage_hash is None:
            rec.status = "no_data"
        elif self.store_dir is None:
            rec.status = "no_store"
        else:
            path = self.store_dir / "storages" / storage_hash
            if not path.is_file():
                rec.status = "missing"
            else:
                target = device if is_available(str(device)) else torch.device("cpu")
                try:
                    loaded = torch.load(path, weights_only=True, map_location=target)
                    data = getattr(loaded, "_untyped_storage", loaded)
                    if not isinstance(data, torch.UntypedStorage):
                        raise TypeError(f"holds a {type(loaded).__name__}, not a storage")
                except Exception as err:  # a damaged file is reported, not fatal
                    rec.status = "unreadable"
                    rec.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                else:
                    rec.status = "real"
                    rec.data = data
                    rec.loaded_on = str(data.device)
        return rec

    def tensor(self, storage, shape, stride=None, *, storage_offset=None, dtype=None,
               requires_grad=None, is_leaf=None, **metadata):
        import torch

        from reproarchive.codec.tensors import AbsentTensor

        shape = tuple(int(s) for s in shape)
        stride = tuple(int(s) for s in stride) if stride is not None else AbsentTensor(shape, dtype).contiguous_stride()
        storage_offset = int(storage_offset or 0)
        dtype = dtype if dtype is not None else torch.float32
        requires_grad = bool(requires_grad)
        is_leaf = bool(is_leaf) if is_leaf is not None else False
        info = {"kind": "tensor", "storage": storage.name, "file": storage.file,
                "data": storage.status, "dtype": str(dtype).replace("torch.", ""),
                "shape": list(shape), "device": str(storage.device)}
        if storage.status == "real":
            t = _tensor_on(storage.data, shape, stride, storage_offset, dtype, requires_grad,
                           is_leaf, metadata)
            value: Any = t
        else:
            value = AbsentTensor(shape, dtype, stride=stride, storage_offset=storage_offset,
                                 device=str(storage.device), requires_grad=requires_grad)
        self._args.append(value)
        self.inputs.append(info)
        return value

    def symint(self, val, *, expr=None):
        self._args.append(val)
        self.inputs.append({"kind": "symint", "hint": val, "expr": expr})
        return val

    def const(self, name):
        self._args.append(None)
        self.inputs.append({"kind": "const", "note": "filtered out during compilation"})

    def unsupported(self, name):
        self._args.append(None)
        self.inputs.append({"kind": "unsupported",
                            "note": "PyTorch could not save this input (e.g. a tensor subclass); it is None"})

    def generator(self, device_type, device_index):
        self._args.append(None)
        self.inputs.append({"kind": "generator", "device": f"{device_type}:{device_index}",
                            "note": "a torch.Generator input; stored as None"})

    def opaque(self, script_class_name):
        self._args.append(None)
        self.inputs.append({"kind": "opaque", "note": f"opaque object {script_class_name}; stored as None"})


def _tensor_on(storage, shape, stride, storage_offset, dtype, requires_grad, is_leaf, metadata):
    """Exactly what InputReader.tensor does, including its fake autograd history for non-leaves."""
    import torch


    t = torch.tensor([], dtype=dtype, device=storage.device, requires_grad=requires_grad)
    with torch.no_grad():
        t.set_(storage, storage_offset, shape, stride)
    if not is_leaf:
        with torch.enable_grad():
            t = t.clone(memory_format=torch.preserve_format)
        with torch.no_grad():
            t.set_(storage, storage_offset, shape, stride)
    set_tensor_metadata(t, metadata)
    return t
