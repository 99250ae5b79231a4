"""The Celery app. Settings come from Django's (CELERY_* names)."""

import os
from typing import Any

from celery import Celery
from celery.signals import (
    celeryd_after_setup,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutdown,
)
from kombu.transport import TRANSPORT_ALIASES

# "filesystem://" (the embedded default) gets the atomic-write variant.
TRANSPORT_ALIASES["filesystem"] = "agentrun.infra.broker:Transport"
# Redis: kombu's transport without a new client per command (see the module).
TRANSPORT_ALIASES["redis"] = TRANSPORT_ALIASES["rediss"] = "agentrun.infra.redis:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")

app = Celery("agentrun")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["agentrun"])


# A task is to a worker what a request is to the web server: keep its database
# connection across tasks (a new PostgreSQL connection costs ~5 ms, a trivial step's
# worth), dropping it only when it is broken or older than CONN_MAX_AGE. Celery's own
# Django fixup would close it around every task; CELERY_DB_REUSE_MAX spaces that out.
@task_prerun.connect
@task_postrun.connect
def _close_old_connections(**_: Any) -> None:
    from django.db import close_old_connections

    close_old_connections()


# A worker executes what any worker may (the default queue) and what asks for its own code
# version (a queue of that version's), and says it is alive with that version, so that a run
# waiting for a version nobody runs says so (agentrun.engine.versions).
@celeryd_after_setup.connect
def _consume_the_queue_of_this_code_version(
    sender: Any = None, instance: Any = None, **_: Any
) -> None:
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()
    from agentrun.engine import versions

    version = versions.settle()
    instance.app.amqp.queues.select_add(versions.queue_for(version))


_HEARTBEAT: list[Any] = []


@worker_ready.connect
def _say_this_worker_is_alive(sender: Any = None, **_: Any) -> None:
    from agentrun.engine.versions import Heartbeat

    name = getattr(sender, "hostname", "") or ""
    heartbeat = Heartbeat(f"{name}:{os.getpid()}" if name else "")
    heartbeat.start()
    _HEARTBEAT.append(heartbeat)


@worker_shutdown.connect
def _say_this_worker_is_gone(**_: Any) -> None:
    while _HEARTBEAT:
        _HEARTBEAT.pop().stop()


# The worker's own metrics (the steps it ran) on a port of its own, when one is set; and
# the spans it still buffers exported before it goes.
@worker_ready.connect
def _serve_this_workers_metrics(**_: Any) -> None:
    from agentrun.telemetry import metrics

    metrics.serve_worker_metrics()


@worker_shutdown.connect
def _export_the_last_spans(**_: Any) -> None:
    from agentrun.telemetry import tracing

    tracing.shutdown()


# The LLM client costs ~1.5 s to import and its TLS settings ~20 ms to build: both
# happen when a worker starts, in the background (the worker is ready meanwhile), not
# in its first hundred steps in flight.
def _prepare_the_llm_client() -> None:
    from agentrun.builtin import llm

    llm.prepare()


# Each step waiting on a model keeps its thread's connection to the provider open: a worker
# of thousands of threads needs thousands of file descriptors, more than the usual soft
# limit of 1,024. Raised to the hard limit, as far as the threads need it.
@worker_init.connect
def _allow_a_socket_per_thread(**_: Any) -> None:
    import resource

    from django.conf import settings

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * settings.AGENTRUN_WORKER_CONCURRENCY + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, ceiling), hard))


@worker_init.connect
def _start_preparing_the_llm_client(**_: Any) -> None:
    import threading

    threading.Thread(target=_prepare_the_llm_client, name="prepare-llm", daemon=True).start()


# Likewise the exporter of traces, when they are on, and the URL configuration their step
# links come from (about a second of imports).
def _prepare_tracing() -> None:
    from agentrun.telemetry import tracing

    tracing.prepare()


@worker_init.connect
def _start_preparing_tracing(**_: Any) -> None:
    import threading

    threading.Thread(target=_prepare_tracing, name="prepare-tracing", daemon=True).start()


# Celery's threads pool starts a thread per task until it has `concurrency` of them,
# and the consumer waits for each new thread to run before it takes the next message:
# under load every start waits its turn for the GIL, and a burst of new runs queued
# behind them. Started all at once, before the first message, they cost nothing later.
@worker_ready.connect
def _start_the_pool_threads(sender: Any = None, **_: Any) -> None:
    executor = getattr(getattr(sender, "pool", None), "executor", None)
    start_one = getattr(executor, "_adjust_thread_count", None)  # CPython's executor
    if start_one is None:
        return
    # Each call starts a thread while none is idle and the pool is not full yet.
    for _ in range(executor._max_workers):
        start_one()


# The cyclic garbage collector walked every object the worker allocated since it
# started (Django, the SDK, hundreds of threads' steps in flight) over and over: ~0.5 ms
# of CPU per LLM-bound step with 300 in flight. What exists once the worker is ready
# lives as long as the process: frozen, it is never walked again. And a young
# collection every 10,000 new objects instead of 700: a step allocates thousands, and
# frees nearly all of them by reference counting, not by the collector.
GC_GEN0_THRESHOLD = 10_000


@worker_ready.connect
@worker_process_init.connect  # a prefork pool's children
def _freeze_startup_objects(**_: Any) -> None:
    import gc

    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


# A profile of the CPU time of everything a worker process runs, for bench/
# (AGENTRUN_PROFILE_PATH=file): each thread profiles itself (cProfile follows one
# thread) on its own CPU clock, and the threads' stats are merged into file.<pid>
# when the worker shuts down (a minute or more: it has hundreds of threads).
def _start_profiling() -> None:
    import cProfile
    import threading
    import time

    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start_here(*_: Any) -> None:
        profile = cProfile.Profile(time.thread_time)  # CPU time, not waits
        with lock:
            profiles.append(profile)
        profile.enable()  # replaces this hook in this thread

    def dump(**_: Any) -> None:
        import pstats

        started = time.monotonic()
        with lock:
            for profile in profiles:
                profile.disable()
            stats = pstats.Stats(*profiles) if profiles else None
        if stats is not None:
            stats.dump_stats(os.environ["AGENTRUN_PROFILE_PATH"] + f".{os.getpid()}")
        print(f"profile of {len(profiles)} threads written in {time.monotonic() - started:.0f} s")

    threading.setprofile(start_here)
    start_here()
    worker_shutdown.connect(dump, weak=False)


if os.environ.get("AGENTRUN_PROFILE_PATH"):
    _start_profiling()
