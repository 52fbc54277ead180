"""The OpenAI-compatible relay: ``/api/v1/relay/chat/completions`` and ``/models``.

``views`` (thin: the OpenAI error shape, one call each) → ``service`` (auth, whitelist,
limits, the upstream call and its pass-through stream) → ``limits`` (rate limits and
budgets, Redis or the database), ``pool`` (the provider keys, encrypted by ``secrets``)
and ``usage`` (the records and the Usage page's figures).
"""
