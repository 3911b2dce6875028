"""`specsample eval`: task-level evaluation (ASR word error rate, summarization ROUGE)."""
import click


@click.group(name="eval")
def eval_group():
    """Accuracy and verification time of baseline / exact / sigmoid verification on real tasks."""
