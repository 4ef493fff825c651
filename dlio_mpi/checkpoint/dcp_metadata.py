"""A DCP save's `.metadata`, pickled once and finished per checkpoint: everything but its
storage_meta (the checkpoint's path and save id, the last fields but the version) depends
only on the save plan, so the pickle is run once up to storage_meta (seconds to a minute at
a thousand ranks, docs/dcp_facts.md section 7) and each save only pickles the tail: the
bytes equal dcp_plan.metadata_bytes(plan, path, save_id)'s."""

from __future__ import annotations

import uuid

from .dcp_plan import DcpSavePlan, _Pickler4, metadata_fields, metadata_object, storage_meta


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
