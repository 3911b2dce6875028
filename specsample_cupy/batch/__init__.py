"""`specsample generate`: datasets of prompts decoded to JSONL lines, resumable, locally or on Ray."""
