"""Guidance for failed tasks: teacher hints (Agent-RLVR) and reference action prefixes (ActGuide-RL)."""
