"""Store methods: requests for human input (of input functions; see DurableGraphFlow's human_input)."""

from __future__ import annotations

from graphflow_durable._model.human import InputRequest
from graphflow_durable._storage.requests import InputRequests
from graphflow_durable._store.base import StoreBase

__all__ = ["HumanInputMethods"]


class HumanInputMethods(StoreBase):
    """Human input: the store's requests, a run's pending ones, and answering them."""

    @property
    def requests(self) -> InputRequests:
        """The requests for human input of this store's runs (record, read, answer, cancel)."""
        return self._requests

    def pending_requests(self, run_id: str) -> list[InputRequest]:
        """The run's pending requests for human input (node, prompt, idempotency key, time,
        deadline), oldest first; empty when it waits for nobody."""
        return self._requests.pending(run_id)

    def respond(
        self, run_id: str, answer: str, *, node: str | None = None, request_id: str | None = None
    ) -> InputRequest:
        """Answer a pending request for human input of ``run_id``, as if the person had typed
        ``answer``; return the answered request. A ``waiting`` run becomes ``interrupted`` once none
        of the requests it waits on is pending (until then it still reads ``waiting``): the next
        ``run()`` (or a worker of a pool) resumes it, and the asking node's turn runs again and gets
        this answer. A run still being driven takes the answer when the node's batch would park.
        ``node`` or ``request_id`` names the request when several are pending.

        Raises:
            RunNotFoundError: no such run.
            NotWaitingError: (a :class:`UsageError`) no pending request (the run is not waiting, or
                the request was already answered, e.g. by a concurrent call: exactly one wins), or
                several and none named, or the run is cancelled (resumed, it asks again). Nothing
                was changed.
        """
        return self._requests.answer(run_id, answer, node=node, request_id=request_id, by="respond")
