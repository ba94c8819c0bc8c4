"""Records that leave a field out when it is empty, so that what they are written as stays
what it was before the field existed: job.json (and so a bundle's digest), a stored request,
a message an older peer must still read."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


class LeavesOutEmpty(BaseModel):
    """Mixed into a record: each field named in LEFT_OUT_EMPTY is not written when empty (an
    empty map or list, an empty text, None)."""

    LEFT_OUT_EMPTY: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _empty_left_out(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for key in self.LEFT_OUT_EMPTY:
                if data.get(key) in (None, {}, [], (), ""):
                    data.pop(key, None)
        return data
