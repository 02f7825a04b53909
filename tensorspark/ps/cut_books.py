"""A shard's books at a consistent cut: what a shard restarted from that cut takes back,
besides its slice, before it replays its journal (:mod:`tensorspark.ps.revive`,
:mod:`tensorspark.ps.journal`).

The books are the store's status at the cut (its counters and worker rows), and under
:data:`KEYS` the exactly-once memory that is no parameter: each partition's last
``/vocab`` keys (:class:`~tensorspark.ps.vocab_keys.VocabKeys`) and the bases of the
pushes refused as stale and not yet applied (:class:`~tensorspark.ps.push_checks.Rebases`).
Taken with the journal's rotation, on the shard's loop (no request between them); they
travel as JSON: the shard's answer to the cut, the driver's
:class:`~tensorspark.ps.bases.Base` (``ledger``), the restart's init.

Not in a checkpoint (:meth:`Store.snapshot <tensorspark.ps.store.Store.snapshot>`'s
state): a checkpoint also starts a new job (``resume=True``), whose attempts and keys start
again; the old job's keys would refuse its requests with 409.

Runs in the shard process, on its loop thread (:func:`books`) and before its loop starts
(:func:`load`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tensorspark.ps.ledger import COUNTERS, WorkerState

if TYPE_CHECKING:  # (the driver imports this module with ps/shard.py: no store there)
    from tensorspark.ps.store import Store

logger = logging.getLogger(__name__)

#: The books' entry of the keys: ``{"rebases": [...], "vocab": {...} or None}``.
KEYS = "cut_keys"


def books(store: Store) -> dict[str, Any]:
    """``store``'s books now (JSON): its status, with the keys under :data:`KEYS`."""
    out = store.status()
    vocab = None if store.vocab is None else store.vocab.keys.books()
    out[KEYS] = {"rebases": store.rebases.entries(), "vocab": vocab}
    return out


def load(store: Store, ledger: Mapping[str, Any] | None) -> None:
    """Take a cut's books (:func:`books`; None: the shard's first base, none) back into a
    restarted shard's ``store``, before the journal since the cut is replayed."""
    if not ledger:
        return
    store.ledger.counters.update({k: int(ledger.get(k, 0)) for k in COUNTERS})
    for row in ledger.get("workers", ()):  # status rows: the identity as attempt_id
        state = {**row, "attempt": row.get("attempt_id", row["attempt"])}
        state.pop("attempt_id", None)
        store.ledger.workers[int(row["partition"])] = WorkerState(**state)
    keys = ledger.get(KEYS) or {}
    store.rebases.load(keys.get("rebases") or ())
    if keys.get("vocab"):
        if store.vocab is None:
            logger.warning("the cut's books hold /vocab keys, and this shard no dynamic table")
        else:
            store.vocab.keys.load(keys["vocab"])
