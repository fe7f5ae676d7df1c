"""Batches of attempts and what is built on them: the sandbox pool, the rescue of failed tasks, the
families compared head to head, their costs, the batch's invariants and the rounds of the loop."""
