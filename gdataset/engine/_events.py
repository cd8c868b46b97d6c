"""The checkpoint events of a loop on the workers: rank 0 sends its records on the fit's topic in
batches, one at most every ``gdask.engine.progress-interval`` (the last one's state too once per
``gdask.engine.checkpoint-interval``), the client hands them to the fit's records; the scheduler
forwards them and keeps none.

A scheduler stores every event of every topic (for ``Client.get_events``) and never drops a topic,
so a fit's checkpoints (a state can take tens of KB) would stay in the scheduler's memory for
its life. :class:`LoopEvents`, a scheduler plugin the engine installs where missing, drops each
checkpoint once the scheduler has sent it to the topic's subscribers, and the topic itself when the
fit ends (the client says so) or when nobody subscribes to it any more (its client left).
"""

from __future__ import annotations

import logging
import pickle
import queue
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from gdask import protocol
from gdask._compat import event_topics, forget_events
from gdask.gdataset.engine._records import Records

logger = logging.getLogger("gdask.gdataset")

__all__ = ["CheckpointEvents", "LoopEvents", "loop_topic"]


def loop_topic(token: str) -> str:
    """The event topic of the loop on the workers of fit ``token``."""
    return f"{protocol.EVENT_LOOP_PREFIX}{token}"


class LoopEvents(SchedulerPlugin):
    """(scheduler) Keeps no copy of the loops' checkpoint events; drops a loop's topic at its end, or
    when its client leaves. Keeps no copy of the loops' durations either (:data:`~gdask.protocol.EVENT_OBSERVE`,
    read by the placement plugin as they come)."""

    name = protocol.PLUGIN_LOOP_EVENTS
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers[protocol.HANDLER_LOOP_EVENTS_DONE] = self._handle_done

    def log_event(self, topic: str, msg: Any) -> None:
        # the scheduler sent the event to the topic's subscribers before it calls its plugins: drop its
        # copy, and the topic when its client is gone (nobody would ever read it)
        # (the durations are read by the placement plugin as they come, if there is one)
        if self.scheduler is not None and isinstance(topic, str) and (
                topic.startswith(protocol.EVENT_LOOP_PREFIX) or topic == protocol.EVENT_OBSERVE):
            forget_events(self.scheduler, topic, drop=True)

    def remove_client(self, scheduler: Any, client: str) -> None:
        # a client that left without closing its fits stays subscribed to their topics
        for topic in event_topics(scheduler):
            if topic.startswith(protocol.EVENT_LOOP_PREFIX):
                forget_events(scheduler, topic, unsubscribe=client, drop=True)

    async def _handle_done(self, topic: str = "", client: str = "") -> None:
        if topic.startswith(protocol.EVENT_LOOP_PREFIX):
            forget_events(self.scheduler, topic, unsubscribe=client, drop=True)


class _Inbox:
    """The client's handler of one loop topic: it queues the checkpoints while the loop runs and
    drops whatever comes after :meth:`close` (distributed keeps a client's handlers for good: this
    one then holds nothing)."""

    def __init__(self) -> None:
        self.queue: queue.Queue | None = queue.Queue()

    def __call__(self, event: Any) -> None:
        q = self.queue
        if q is not None:
            msg = event[1]
            for it, rec in pickle.loads(msg["progress"]) if "progress" in msg else ():  # records without their state
                q.put((it, None, rec))
            if "checkpoint" in msg:  # (iteration, state, record): the batch's last
                q.put(pickle.loads(msg["checkpoint"]))

    def get(self) -> Any:
        if self.queue is None:
            raise queue.Empty
        return self.queue.get_nowait()

    def close(self) -> None:
        self.queue = None


class CheckpointEvents:
    """The checkpoints rank 0 sends on the loop's topic, handed to the fit's records in this thread
    (in order, once each) whenever :meth:`drain` is called. :meth:`close` takes the last ones, then
    tells the scheduler (without waiting) that the topic is done: it unsubscribes this client there
    and drops the topic."""

    def __init__(self, client: Any, topic: str, records: Records) -> None:
        self.client = client
        self.topic = topic
        self.records = records
        self.inbox = _Inbox()
        client.subscribe_topic(topic, self.inbox)

    def drain(self) -> None:
        while True:
            try:
                it, st, rec = self.inbox.get()
            except queue.Empty:
                return
            self.records.newer(it, st, rec)

    def close(self) -> None:
        # every checkpoint of a loop whose tasks ended came before their results, on the same stream
        self.drain()
        self.inbox.close()
        try:
            self.client.loop.add_callback(self._done)
        except (AttributeError, RuntimeError) as e:  # a client without a running loop (closing): the
            # scheduler drops the topic when the client leaves
            logger.debug("could not tell the scheduler that topic %s is done: %r", self.topic, e)

    async def _done(self) -> None:
        try:
            await getattr(self.client.scheduler, protocol.HANDLER_LOOP_EVENTS_DONE)(topic=self.topic,
                                                                                   client=self.client.id)
        except Exception as e:  # noqa: BLE001 - the client or scheduler closed meanwhile: the topic goes with it
            logger.debug("could not tell the scheduler that topic %s is done: %r", self.topic, e)
