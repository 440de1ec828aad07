"""Framework adapters over ``logstore.client`` (each an optional extra):

- ``logstore.client.adapters.langchain.LogstoreChatMessageHistory``: LangChain's
  ``BaseChatMessageHistory`` (``pip install 'logstore-memory[langchain]'``);
- ``logstore.client.adapters.openai_agents.LogstoreSession``: the OpenAI Agents SDK's ``Session``
  (``pip install 'logstore-memory[openai-agents]'``).

The log is append-only, so "clear" and "pop" are appended as marker items that the adapters interpret on
read (``markers``); erasing data is the operator's ``logstore conversation delete``.
"""
