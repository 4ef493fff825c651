"""Which files dlio-mpi may write, rename over or delete: only its own, decided per file; the
names that say so (temporaries, the lock), no I/O (the storage implementations act on them).

- Temporaries are created exclusively (O_EXCL) under a name no user file has:
  `<final>.dlio_mpi-<tag>.tmp`, where the tag is drawn per job and recorded (in the dataset
  manifest, the results manifest) before the first one is created, so that a later job can
  clean a dead job's temporaries knowing they are ours.
- A temporary becomes its final name by a rename that never replaces an existing file, except
  where the caller names the file it replaces as its own (Storage.rename_noreplace,
  Storage.replace_own).
- A folder is claimed by one job at a time through a lock file (LOCK_NAME) holding the host,
  pid and process start time; a lock whose process is gone (same host) is stale and taken over
  (Storage.claim).
"""

from __future__ import annotations

import secrets

TMP_MARK = ".dlio_mpi-"
LOCK_NAME = "dlio_mpi.lock"


def new_tag() -> str:
    """A job's temporaries' tag: 48 random bits, so that no other file carries it."""
    return secrets.token_hex(6)


def temporary_name(final: str, tag: str) -> str:
    return f"{final}{TMP_MARK}{tag}.tmp"


def is_temporary_of(name: str, tags) -> bool:
    """Whether a file name is a temporary of a job with one of `tags`."""
    if not name.endswith(".tmp") or TMP_MARK not in name:
        return False
    return name[:-4].rpartition(TMP_MARK)[2] in tags
