"""A DCP save's `.metadata`, pickled once and finished per checkpoint: everything but its
storage_meta (the checkpoint's path and save id, the last fields but the version) depends
only on the save plan, so the pickle is run once up to storage_meta (seconds to a minute at
a thousand ranks, docs/dcp_facts.md section 7) and each save only pickles the tail: the
bytes equal metadata_bytes(plan, path, save_id)'s. The pickle is CPython's protocol 4
emulated on a mirror of torch's Metadata objects (docs/dcp_facts.md section 7)."""

from __future__ import annotations

import struct
import uuid

from .dcp_archive import pickle_int
from .dcp_plan import DcpSavePlan


# ---------------------------------------------------------------------------- .metadata
class _Global:
    """A class, function or dtype that pickle writes by reference (module, name)."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class _NewObj:
    """An instance pickled as copyreg.__newobj__(cls) then BUILD(state); state None: no BUILD."""

    __slots__ = ("cls", "state")

    def __init__(self, cls: _Global, state: object) -> None:
        self.cls, self.state = cls, state


class _Reduce:
    """An object pickled as func(*args) (REDUCE)."""

    __slots__ = ("func", "args")

    def __init__(self, func: _Global, args: tuple) -> None:
        self.func, self.args = func, args


def _fresh(text: str) -> str:
    """An equal str that is another object, as an unpickled one is (but one character: CPython
    caches those, so they stay one object)."""
    return text[:1] + text[1:]


class _Pickler4:
    """CPython's C pickler (Modules/_pickle.c), protocol 4, for the objects of a DCP Metadata:
    memo by identity (MEMOIZE; BINGET, LONG_BINGET from 256), SHORT_BINUNICODE, batches of
    1000 (a dict's last batch of MARK..SETITEMS even if empty, unless it has one item), and
    frames of at least 64 KiB committed where a save() begins."""

    FRAME_TARGET, BATCH = 64 * 1024, 1000

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x04")
        self.memo: dict[int, tuple[int, object]] = {}
        self.frame_start = len(self.out)
        self.out += bytes(9)

    def dumps(self, obj: object) -> bytes:
        self.save(obj)
        self.out += b"."
        self._commit_frame()
        return bytes(self.out)

    def _commit_frame(self) -> None:
        length = len(self.out) - self.frame_start - 9
        if length >= 4:
            self.out[self.frame_start:self.frame_start + 9] = b"\x95" + struct.pack("<Q", length)
        else:
            del self.out[self.frame_start:self.frame_start + 9]

    def _boundary(self) -> None:
        if len(self.out) - self.frame_start - 9 >= self.FRAME_TARGET:
            self._commit_frame()
            self.frame_start = len(self.out)
            self.out += bytes(9)

    def _memoize(self, obj: object) -> None:
        self.memo[id(obj)] = (len(self.memo), obj)
        self.out += b"\x94"

    def save(self, obj: object) -> None:
        self._boundary()
        if obj is None or obj is True or obj is False:
            self.out += {None: b"N", True: b"\x88", False: b"\x89"}[obj]
        elif type(obj) is int:
            self.out += pickle_int(obj)
        elif id(obj) in self.memo:
            index = self.memo[id(obj)][0]
            self.out += b"h" + bytes((index,)) if index < 256 else b"j" + struct.pack("<I", index)
        elif type(obj) is str:
            data = obj.encode()
            self.out += (b"\x8c" + bytes((len(data),)) if len(data) < 256
                         else b"X" + struct.pack("<I", len(data))) + data
            self._memoize(obj)
        else:
            self._save_container(obj)

    def _save_container(self, obj: object) -> None:
        if type(obj) is tuple:
            self._save_tuple(obj)
        elif type(obj) is list:
            self._save_list(obj)
        elif type(obj) is dict:
            self._save_dict(obj)
        elif type(obj) is _Global:
            self.save(obj.module)
            self.save(obj.name)
            self.out += b"\x93"
            self._memoize(obj)
        elif type(obj) is _Reduce:
            self.save(obj.func)
            self.save(obj.args)
            self.out += b"R"
            self._memoize(obj)
        else:
            self.save(obj.cls)
            self.save(())
            self.out += b"\x81"
            self._memoize(obj)
            if obj.state is not None:
                self.save(obj.state)
                self.out += b"b"

    def _save_tuple(self, obj: tuple) -> None:
        if not obj:
            self.out += b")"
            return
        if len(obj) > 3:
            self.out += b"("
        for value in obj:
            self.save(value)
        self.out += b"\x85\x86\x87"[len(obj) - 1:len(obj)] if len(obj) <= 3 else b"t"
        self._memoize(obj)

    def _save_list(self, obj: list) -> None:
        self.out += b"]"
        self._memoize(obj)
        if len(obj) == 1:
            self.save(obj[0])
            self.out += b"a"
            return
        for start in range(0, len(obj), self.BATCH):
            self.out += b"("
            for value in obj[start:start + self.BATCH]:
                self.save(value)
            self.out += b"e"

    def _save_dict(self, obj: dict) -> None:
        self.out += b"}"
        self._memoize(obj)
        items = list(obj.items())
        if len(items) == 1:
            self.save(items[0][0])
            self.save(items[0][1])
            self.out += b"s"
            return
        for start in range(0, len(items) + 1 if items else 0, self.BATCH):
            self.out += b"("
            for key, value in items[start:start + self.BATCH]:
                self.save(key)
                self.save(value)
            self.out += b"u"


_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_TORCH_MODULE = "torch"  # whichmodule's answer for a dtype: one str, its sys.modules key
_DTYPE_NAME = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
DCP_VERSION = "1.0.0"  # filesystem.py:71


class _MetadataClasses:
    """The globals a Metadata pickle refers to, each one object (memoized once)."""

    def __init__(self) -> None:
        meta = {name: _Global(_METADATA_MODULE, name) for name in (
            "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
            "BytesStorageMetadata", "MetadataIndex", "StorageMeta")}
        self.__dict__.update(meta)
        self.storage_info = _Global("torch.distributed.checkpoint.filesystem", "_StorageInfo")
        self.size = _Global(_fresh(_TORCH_MODULE), "Size")
        self.dtypes = {k: _Global(_TORCH_MODULE, v) for k, v in _DTYPE_NAME.items()}
        self.strided = _Reduce(_Global("torch.serialization", "_get_layout"), ("torch.strided",))
        self.contiguous = _Reduce(_Global(_METADATA_MODULE, "_MEM_FORMAT_ENCODING"), (0,))
        self.posix_path = _Global("pathlib", "PosixPath")

    def torch_size(self, values: tuple[int, ...]) -> _Reduce:
        return _Reduce(self.size, (tuple([*values]),))  # a new tuple: torch.Size pickles one

    def properties(self, dtype: str) -> _NewObj:
        """TensorProperties: its __getstate__'s tuple (metadata.py:57-75)."""
        return _NewObj(self.TensorProperties,
                       (self.dtypes[dtype], self.strided, False, self.contiguous, False))


def _state_dict_metadata(plan: DcpSavePlan, g: _MetadataClasses, fqn_of) -> dict:
    """fqn -> TensorStorageMetadata or BytesStorageMetadata, built from the deduplicated plans
    in rank order (default_planner.py:570-611); keys are the first plan's fqn objects."""
    md: dict = {}
    for rank in range(plan.world):
        for item in plan.kept_items(rank):
            e = item.entry
            if e.kind == "bytes":
                md[fqn_of(rank, e.fqn)] = _NewObj(g.BytesStorageMetadata, None)
                continue
            if e.fqn not in md:
                md[fqn_of(rank, e.fqn)] = _NewObj(g.TensorStorageMetadata, {
                    "properties": g.properties(e.dtype), "size": g.torch_size(e.shape),
                    "chunks": []})
            md[e.fqn].state["chunks"].append(_NewObj(g.ChunkStorageMetadata, {
                "offsets": g.torch_size(item.chunk_offsets),
                "sizes": g.torch_size(item.chunk_sizes)}))
    return md


def _planner_data(plan: DcpSavePlan, fqn_of) -> dict:
    """fqn -> path in the nested state dict: dict(ChainMap(*plans' mappings)), so the last
    rank's keys, in its order, and rank 0's paths (default_planner.py:150-152). A path holds
    its state dict's key objects: the optimizer's fqns are not the model's (get_state_dict)."""
    shared: dict[str, str] = {}
    optim_fqns: dict[str, str] = {}

    def one(key: object) -> object:
        return key if type(key) is int else shared.setdefault(key, _fresh(key))

    paths = {}
    for e in plan.entries:
        path = [one(key) for key in e.path]
        if e.path[:2] == ("optim", "state"):
            path[2] = optim_fqns.setdefault(e.path[2], _fresh(e.path[2]))
        paths[fqn_of(plan.world - 1, e.fqn)] = tuple(path)
    return paths


def _storage_data(plan: DcpSavePlan, g: _MetadataClasses, chunk_index) -> dict:
    """MetadataIndex -> _StorageInfo of every item, rank by rank, each rank's files in order
    and their items in write order (filesystem.py:758-764): fresh objects (gathered), but
    one file name per file of a rank."""
    data = {}
    for rank in range(plan.world):
        for planned_file in plan.rank_files(rank):
            name = _fresh(planned_file.name)
            for item in planned_file.items:
                index = {"fqn": _fresh(item.fqn), "index": None}
                if item.kind != "bytes":
                    index["index"] = chunk_index[(item.fqn, item.chunk_offsets)]
                    index["offset"] = g.torch_size(item.chunk_offsets)
                data[_NewObj(g.MetadataIndex, index)] = _NewObj(g.storage_info, {
                    "relative_path": name, "offset": item.offset, "length": item.length})
    return data


def metadata_fields(plan: DcpSavePlan) -> tuple[_MetadataClasses, dict]:
    """The globals and the Metadata's fields but storage_meta (which holds the checkpoint's
    path and save id): state_dict_metadata, planner_data, storage_data."""
    g = _MetadataClasses()
    objects: dict[tuple[int, str], str] = {}

    def fqn_of(rank: int, fqn: str) -> str:
        return objects.setdefault((rank, fqn), _fresh(fqn))

    state = _state_dict_metadata(plan, g, fqn_of)
    chunk_index = {(fqn, tuple(c.state["offsets"].args[0])): i
                   for fqn, md in state.items() if md.state
                   for i, c in enumerate(md.state["chunks"])}
    return g, {"state_dict_metadata": state, "planner_data": _planner_data(plan, fqn_of),
               "storage_data": _storage_data(plan, g, chunk_index)}


def storage_meta(g: _MetadataClasses, checkpoint_path: str, save_id: str) -> _NewObj:
    """StorageMeta(checkpoint_id=Path(checkpoint_path), save_id): PurePosixPath's parts."""
    import pathlib

    parts = tuple(_fresh(p) for p in pathlib.PurePosixPath(checkpoint_path).parts)
    return _NewObj(g.StorageMeta, {
        "checkpoint_id": _Reduce(g.posix_path, parts), "save_id": _fresh(save_id),
        "load_id": None, "modules": []})


def metadata_object(g: _MetadataClasses, fields: dict, meta: object) -> _NewObj:
    """The Metadata of `fields` (metadata_fields) and `meta` (storage_meta)."""
    return _NewObj(g.Metadata, {**fields, "storage_meta": meta, "version": _fresh(DCP_VERSION)})


def metadata_bytes(plan: DcpSavePlan, checkpoint_path: str, save_id: str = "0" * 36) -> bytes:
    """The .metadata the coordinator writes (pickle.dump of Metadata, filesystem.py:758-790)
    for this save into `checkpoint_path` (as given to FileSystemWriter: PurePosixPath's parts
    are pickled) with this uuid4 save_id (36 characters). Exact but for thread_count > 1,
    where the order threads finish files in can move a 64 KiB frame's end (9 bytes)."""
    g, fields = metadata_fields(plan)
    return _Pickler4().dumps(metadata_object(g, fields, storage_meta(g, checkpoint_path,
                                                                     save_id)))





class _Paused(Exception):
    """Raised where the pickler meets storage_meta's place."""


_HERE = object()  # stands for storage_meta while the template is pickled


class _PausingPickler(_Pickler4):
    def save(self, obj: object) -> None:
        if obj is _HERE:
            raise _Paused
        super().save(obj)


class MetadataTemplate:
    """The pickle of a plan's Metadata up to its storage_meta; `render` finishes it."""

    def __init__(self, plan: DcpSavePlan) -> None:
        self.g, fields = metadata_fields(plan)
        self.metadata = metadata_object(self.g, fields, _HERE)
        pickler = _PausingPickler()
        try:
            pickler.dumps(self.metadata)
        except _Paused:
            pass
        self._out, self._memo = pickler.out, pickler.memo
        self._frame_start = pickler.frame_start

    def render(self, checkpoint_path: str, save_id: str | None = None) -> bytes:
        """The .metadata of a save into `checkpoint_path` (as given to FileSystemWriter) with
        `save_id` (a fresh uuid4, 36 characters, when None)."""
        p = _Pickler4()
        p.out, p.memo, p.frame_start = bytearray(self._out), dict(self._memo), self._frame_start
        p.save(storage_meta(self.g, checkpoint_path, save_id or str(uuid.uuid4())))
        state = self.metadata.state
        version = next(k for k in state if k == "version")  # the dict's own key object
        p.save(version)
        p.save(state[version])
        p.out += b"u"  # the end of the fields' one batch (_save_dict)
        p.out += b"b"  # BUILD the Metadata from its fields (_NewObj)
        p.out += b"."
        p._commit_frame()
        return bytes(p.out)
