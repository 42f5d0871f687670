"""Conformance cases shared by the simulator tier and the live vLLM tier (see cases.py)."""
