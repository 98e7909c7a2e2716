"""The storage node's authoritative status (``storage_node.core.authority``) on disk:
``DATA/authority.json``, written (write, fsync, rename, fsync the directory) before anything
relies on it, so a restart never forgets it, also when the damaged segment is later gone. An
unreadable or malformed file is taken as "nothing can be vouched for": saying too little is
safe, too much is not. Blocking: call from a thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from shared.durable_files import replace_atomically
from storage_node.core.authority import AuthorityStatus

log = logging.getLogger(__name__)

FILE_NAME = "authority.json"


class AuthorityFile:
    def __init__(self, data_dir: str) -> None:
        self._path = os.path.join(data_dir, FILE_NAME)
        self._lock = threading.Lock()
        self._saved_version = 0

    def load(self, status: AuthorityStatus) -> None:
        """Read the file into ``status`` if there is one."""
        try:
            with open(self._path, "rb") as file:
                document = json.loads(file.read())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as error:
            log.error("%s is unreadable (%s): vouching for nothing", self._path, error)
            status.status_lost()
            return
        if not status.restore(document):
            log.error("%s is malformed: vouching for nothing", self._path)
            status.status_lost()
        self._saved_version = status.version

    def save(self, status: AuthorityStatus) -> None:
        """Write ``status`` durably (atomic replace) unless this version is written already.
        Raises OSError if it cannot."""
        with self._lock:
            version = status.version
            if version == self._saved_version:
                return
            replace_atomically(self._path, json.dumps(status.snapshot(), sort_keys=True).encode())
            self._saved_version = version
