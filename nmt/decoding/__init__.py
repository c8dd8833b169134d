"""Decoding: the search over a model's next-token log-probabilities. The decoding core
(core.py: one step loop and what the Decoding keeps; tight_loops.py: plain greedy search of a
batch, beam search of a few sentences, in tight loops) with its strategies (strategies.py:
greedy, sampling, beams), length rules (lengths.py), rules (rules.py: bans, forced prefixes,
the shortlist's columns), lexical constraints (constrained.py) and admission into a running
batch (admission.py); the models' side of a step (decoder.py) over the fast model it steps
(fast_model.py, its key/value cache fast_state.py, its linear maps affine.py, the fused
one-query attention operator attention_op.py with int8's map of a few rows and top_k beside it,
the step of a few rows compiled ahead of time aot_step.py and the kernel probes probes.py); batch
translation (batches.py) and continuous batching (stepping.py) that drive it, and the typed
messages (messages.py) they and nmt-serve's Batcher exchange."""
