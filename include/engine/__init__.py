"""The engine: drive SGLang servers to answer prompts, as fast as they can, and survive them.

``dispatch`` (the loop), ``planning`` (budgets before sending), ``turns`` (whole
conversations' turns), ``pool`` and ``server_states`` (which server, rest and ejection),
``retry`` (a failed request's verdict), ``window`` (in-flight windows), ``client`` (one
request), ``config``, ``tally`` (counts and progress lines), ``outcome`` (a shard run's
result), ``conversing`` (the conversations' queue), ``variants`` (mixed sampling),
``startup`` (the first requests before the tokenizer is ready).
"""
