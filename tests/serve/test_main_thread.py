"""rlvr.serve.main_thread: work handed over from other threads runs on the loop's thread, in order, with its
result or error back to the caller; nobody waits forever once the loop ends; and `rlvr serve`'s backend
generates on the loop's thread while the HTTP server answers on its own."""

from __future__ import annotations

import threading
import time

import pytest

from rlvr.models.loading import load_model, load_tokenizer
from rlvr.rollout.engines.remote.client import RlvrServerClient
from rlvr.rollout.engines.remote.protocol import GenerateRequest
from rlvr.serve.hf_backend import HFBackend
from rlvr.serve.http import make_server
from rlvr.serve.main_thread import InlineWork, MainThreadWork, ServerStopping


def _in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: B036 - the test reads what the caller saw
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _loop_until(work: MainThreadWork, done: threading.Event, limit_s: float = 30.0) -> None:
    stop = threading.Event()
    watcher = threading.Thread(target=lambda: (done.wait(limit_s), stop.set()))  # a broken test ends instead of hanging
    watcher.start()
    work.run(stop, poll_s=0.01)
    watcher.join()


def test_work_runs_on_the_loops_thread_in_order_with_results_and_errors():
    work, seen, finished = MainThreadWork(), [], threading.Event()

    def caller():
        a = work.call(lambda: (seen.append(("call", threading.get_ident())), 6 * 7)[1])
        work.post(lambda: seen.append(("post", threading.get_ident())))
        with pytest.raises(ValueError, match="bad input"):
            work.call(lambda: (_ for _ in ()).throw(ValueError("bad input")))
        b = work.call(lambda: len(seen))
        finished.set()
        return a, b

    t, out = _in_thread(caller)
    _loop_until(work, finished)
    t.join()
    assert out["result"] == (42, 2)  # the posted work ran before the call handed over after it
    assert [who for _, who in seen] == [threading.get_ident()] * 2 and [k for k, _ in seen] == ["call", "post"]


def test_inline_work_runs_on_the_callers_thread():
    work = InlineWork()
    assert work.call(threading.get_ident) == threading.get_ident()
    ran = []
    work.post(lambda: ran.append(threading.get_ident()))
    assert ran == [threading.get_ident()]


def test_work_left_when_the_loop_ends_fails_instead_of_waiting():
    work, stop = MainThreadWork(), threading.Event()
    late: dict = {}

    def last_job():  # hands over one more job, then ends the loop before that job runs
        late["thread"], late["out"] = _in_thread(lambda: work.call(lambda: "never"))
        while work._jobs.qsize() < 1:
            time.sleep(0.001)
        stop.set()
        return "ran"

    first, out = _in_thread(lambda: work.call(last_job))
    work.run(stop, poll_s=0.01)
    first.join(10)
    late["thread"].join(10)
    assert out["result"] == "ran"
    assert isinstance(late["out"].get("error"), ServerStopping)
    with pytest.raises(ServerStopping):  # handed over after the end: told at once
        work.call(lambda: "never")


def test_serve_generates_on_the_loops_thread(tiny_model_dir):
    tok, _ = load_tokenizer(tiny_model_dir)
    work = MainThreadWork()
    backend = HFBackend(load_model(tiny_model_dir), tok, name="tiny", work=work)
    threads = []
    real = backend.engine.generate
    backend.engine.generate = lambda *a, **k: (threads.append(threading.get_ident()), real(*a, **k))[1]
    server = make_server(backend, "127.0.0.1", 0, None)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in ["1+1=", "2*3="]]
    finished = threading.Event()

    def client():
        try:
            return RlvrServerClient(url).generate(GenerateRequest(ids, 2, [1, 2], [4, 4]))
        finally:
            finished.set()

    t, out = _in_thread(client)
    try:
        _loop_until(work, finished)
    finally:
        server.shutdown()
        server.server_close()
    t.join()
    assert "error" not in out, out.get("error")
    assert len(out["result"].samples) == 2 and all(len(per) == 2 for per in out["result"].samples)
    assert threads == [threading.get_ident()]  # generated here, not on the HTTP handler's thread
