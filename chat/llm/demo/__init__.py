"""The built-in offline demo model: a scripted provider that needs no network.

It speaks the same :class:`~chat.llm.types.Provider` interface as the OpenAI-compatible
provider, so the whole app (streaming, thinking, tool calls with approval, sub-agents,
code blocks, classroom personas, compaction, errors, Stop) can be tried and tested
offline. It is deterministic: the same request always gives the same chunks. The only
"randomness" is a ``random.Random`` seeded from a hash of the request, used to vary
phrasing. Models: ``demo`` (streams at ``token_delay`` per chunk) and ``demo-fast``
(no delay).

The package: ``mechanics`` (the provider, streaming and pacing), ``rules`` (what the
user typed → what the model does; its docstring has the table of triggers) and
``texts`` (the canned texts).
"""

from chat.llm.demo.mechanics import DEMO_MODELS, FAST_MODEL, DemoProvider, split_into_chunks

__all__ = ["DEMO_MODELS", "FAST_MODEL", "DemoProvider", "split_into_chunks"]
