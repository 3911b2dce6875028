"""What the batch-runner tests share: a generate_stream() that fails partway."""


def failing_after_one(real, message):
    """A stand-in for SpeculativeDecoder.generate_stream (`real`) that yields the first finished
    request, then raises ValueError(message), as a stream refused midway does."""
    def fail_after_one(self, *args, **kwargs):
        results = real(self, *args, **kwargs)
        yield next(results)
        results.close()
        raise ValueError(message)
    return fail_after_one
