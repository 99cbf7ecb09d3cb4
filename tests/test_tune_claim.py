"""The claim that makes a worker's "is a trial still needed? then start it" one step (yolo_cb.tune.claim).

Two workers finishing at the same moment once both started a trial the study no longer needed (a CI run of
test_two_processes_share_one_study trained 4 trials of 3). While one claim on a study is held, a second one, as another
worker would take it, waits: on SQLite (flock on the database's folder) and on a real PostgreSQL server (advisory lock).
"""

from __future__ import annotations

import threading

from yolo_cb.tune.claim import TrialClaim


def second_claim_waits(make_claim) -> None:
    first, second = make_claim(), make_claim()
    got_it = threading.Event()

    def take_second():
        second.acquire()
        got_it.set()
        second.release()

    first.acquire()
    worker = threading.Thread(target=take_second, daemon=True)
    worker.start()
    try:
        assert not got_it.wait(1.0), "a second worker took the claim while the first held it"
    finally:
        first.release()
    assert got_it.wait(60), "the claim was not handed on after its release"
    worker.join(60)
    first.release()  # releasing again does nothing
    assert first.hold_if(lambda: False) is False  # no trial needed: the claim is let go at once...
    assert second.hold_if(lambda: True) is True  # ...so the other worker gets it, and keeps it for its trial
    second.release()


def test_sqlite_claim_is_exclusive_between_workers(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    second_claim_waits(lambda: TrialClaim(url, "shared"))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the lock writes nothing beside the database


def test_postgresql_claim_is_exclusive_between_workers(postgres):
    import optuna

    url = postgres.database("claim")
    storage = optuna.storages.RDBStorage(url)
    second_claim_waits(lambda: TrialClaim(url, "shared", storage.engine))
    other_study = TrialClaim(url, "another", storage.engine)
    holder = TrialClaim(url, "shared", storage.engine)
    holder.acquire()
    try:
        got = threading.Event()
        threading.Thread(target=lambda: (other_study.acquire(), got.set(), other_study.release()), daemon=True).start()
        assert got.wait(60), "a claim on another study waited for this one"
    finally:
        holder.release()
    storage.engine.dispose()
