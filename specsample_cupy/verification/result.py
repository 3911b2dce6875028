"""VerifyResult: what verify() returns, one int32 buffer [accepted | emitted | error | tokens] with views
(and the emitted tokens' log-probabilities when asked for)."""
import numpy as np

from specsample_cupy.runtime import errors


class VerifyResult:
    """Outcome of one verification step, arrays of the input's module (NumPy or CuPy), int32.

    accepted [B]: draft tokens accepted per request (-1 where error != 0).
    tokens [B, gamma+1]: the accepted drafts, then the resampled or bonus token, then -1 padding.
    emitted [B]: accepted + 1 (0 where error != 0).
    error [B]: 0, or a bit set of specsample_cupy.errors codes; the request's tokens are all -1.
        verify() returns the codes on both backends and raises nothing for them (its docstring
        lists the rules); check() raises.

    All four live in one buffer [accepted | emitted | error | tokens]; views are made on first use.
    to_host() reads the result (and its logprobs) with one device-to-host copy.
    """
    __slots__ = ("_out", "_B", "_views", "_logprobs", "_joint")

    def __init__(self, out, B, logprobs=None, joint=None):
        """joint: None, or the one int32 allocation [out | logprobs' bits] that holds both (CuPy)."""
        self._out, self._B, self._views, self._logprobs, self._joint = out, B, {}, logprobs, joint

    @property
    def logprobs(self):
        """[B, gamma+1] float32 (verify(..., logprobs=True) only): the log-probability of each emitted
        token under the distribution it was drawn from (the target's, truncated and at the request's
        temperature; greedy requests: at temperature 1), -inf where tokens is -1."""
        if self._logprobs is None:
            raise AttributeError("call verify(..., logprobs=True) for log-probabilities")
        return self._logprobs.reshape(self._B, -1)

    @classmethod
    def from_arrays(cls, xp, accepted, tokens, emitted, error):
        B = accepted.shape[0]
        out = xp.concatenate([accepted.astype(xp.int32), emitted.astype(xp.int32),
                              error.astype(xp.int32), tokens.astype(xp.int32).ravel()])
        return cls(out, B)

    def _view(self, name):
        v = self._views.get(name)
        if v is None:
            B = self._B
            v = {"accepted": lambda: self._out[:B], "emitted": lambda: self._out[B:2 * B],
                 "error": lambda: self._out[2 * B:3 * B],
                 "tokens": lambda: self._out[3 * B:].reshape(B, -1)}[name]()
            self._views[name] = v
        return v

    accepted = property(lambda self: self._view("accepted"))
    emitted = property(lambda self: self._view("emitted"))
    error = property(lambda self: self._view("error"))
    tokens = property(lambda self: self._view("tokens"))

    @property
    def packed(self):
        """The one int32 buffer [accepted B | emitted B | error B | tokens B*(gamma+1)] behind the
        four views: a single device-to-host copy of it reads the whole result."""
        return self._out

    def to_host(self):
        """This result as NumPy arrays (self when it is already). With logprobs=True on CuPy the
        log-probabilities share the packed buffer's allocation, so one copy reads both."""
        if isinstance(self._out, np.ndarray):
            return self
        if self._joint is not None:
            host, n = self._joint.get(), self._out.size
            return VerifyResult(host[:n], self._B, host[n:].view(np.float32))
        return VerifyResult(self._out.get(), self._B, None if self._logprobs is None else self._logprobs.get())

    def check(self):
        """Raise ValueError naming the failed requests (synchronises with the device on CuPy)."""
        err = self.error.get() if hasattr(self.error, "get") else self.error
        errors.raise_if_any(err)
        return self

    def __repr__(self):
        return f"VerifyResult(accepted={self.accepted!r}, tokens={self.tokens!r}, error={self.error!r})"
