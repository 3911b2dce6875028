"""Task-level evaluations (ASR with Whisper pairs, summarization with decoder-only pairs).

Nothing here is imported by the core package; ``specsample eval`` pulls it in.
"""
