"""A model for the OpenAI Agents SDK that needs no network: it answers "echo: <last user text> (<n> inputs)",
so a test can see how much history the Runner handed it (what the session supplied)."""

from __future__ import annotations

from typing import Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText


class EchoModel(Model):
    async def get_response(self, system_instructions, input, *args: Any, **kwargs: Any) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        last = next(i for i in reversed(items) if i.get("role") == "user")
        text = f"echo: {last['content']} ({len(items)} inputs)"
        message = ResponseOutputMessage(
            id="msg_echo",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(text=text, type="output_text", annotations=[], logprobs=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NotImplementedError
