"""``connection_rules.GuardedConnection`` on uvicorn's h11 protocol (``--http h11``, or ``auto`` without
httptools): the client's phase is h11's own state machine, and the header block read so far is h11's
unparsed buffer."""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .connection_rules import GuardedConnection, Phase

__all__ = ["GuardedH11Protocol"]


class GuardedH11Protocol(GuardedConnection, H11Protocol):
    def _client_phase(self) -> Phase:
        # IDLE: h11 starts the next cycle only once the response is complete too.
        state = self.conn.their_state
        if state is h11.IDLE:
            return Phase.HEADERS
        return Phase.BODY if state is h11.SEND_BODY else Phase.SERVER

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # a header block, of which h11 holds what came before
            pending = self.conn.trailing_data[0]
            if self._refused_head(len(pending), bytes(pending[-3:]), data):
                return
        super().data_received(data)  # handle_events below rearms

    def handle_events(self) -> None:
        # Called for every read and, after a response, for the next pipelined request.
        super().handle_events()
        self._rearm()
