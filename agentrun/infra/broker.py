"""The embedded broker: kombu's filesystem transport, with atomic writes.

kombu writes a message file in place, so a consumer listing the folder at the
wrong moment reads an empty file and its consumer loop dies on the JSON error.
Here a message is written under a temporary name and renamed into the queue
folder, which is atomic on POSIX; readers only ever see whole messages.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # No ".msg" suffix: a concurrent _get skips it until the rename.
        partial = os.path.join(self.data_folder_out, f"tmp-{uuid.uuid4().hex}")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel

    # A folder needs no host: without this default, kombu warns "No hostname was
    # supplied" for every `filesystem://` connection (twice at each worker start).
    default_connection_params = {"port": None, "hostname": None}
