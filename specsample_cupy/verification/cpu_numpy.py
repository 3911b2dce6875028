"""NumPy reference of the verification kernels (the CPU path of verify()), and the per-request
error codes every method computes on either backend.

It computes in float64 what kernels_cu/verify.cu computes in float32, with the same Philox
random numbers, the same acceptance rule, the same exponential race and the same error codes,
so kernel and reference agree except on float near-ties. (Where float32 arithmetic with error
bounds settles an acceptance or a race, the float64 rows are not computed: the results are the
same.) Shapes: draft_tokens [B, G] int, draft [B, G, V], target [B, G+1, V], lengths [B] int,
temps [B] float.
"""
import threading

import numpy as np

from specsample_cupy.runtime import errors
from specsample_cupy.runtime.philox import PURPOSE_ACCEPT, acceptance_uniform, race_exponential, random_row_bits


def _or(xp, err, mask, code):
    return err | xp.where(mask, int(code), 0).astype(xp.int32)


def request_errors(draft_tokens, draft, target, lengths, temps, *, probs, greedy_ok=True,
                   greedy_all=False, xp=np, row_max=(None, None), rows=True):
    """Error codes [B] int32 (specsample_cupy.runtime.errors) of every request, as the kernels compute them,
    with arrays of module xp (the GPU baseline runs this on CuPy, without synchronising).

    rows=True checks every active row (below): the rule of the baseline and of truncated sampling,
    which read every row. rows=False leaves the row codes (TARGET_VALUES, DRAFT_VALUES, NO_MASS)
    out: reference_verify() adds those of the rows its decisions read (_RowChecks).

    Rules (verify()'s docstring states them for users):
      TEMPERATURE: temps[b] negative or not finite, or 0 where the method has no greedy mode
          (greedy_ok=False); such a request is checked at temperature 1.
      LENGTH: lengths[b] outside [0, G]; the request is checked with L = lengths[b] clamped.
      Active rows: target rows 0..L; draft rows 0..L-1 unless the request is greedy (temperature 0
          with greedy_ok, or greedy_all).
      TARGET_VALUES / DRAFT_VALUES: an active row holds NaN or +Inf (probs: NaN, a negative
          value or +Inf).
      NO_MASS: an active row has no entry > -Inf (probs: no entry in (0, +Inf)).
      TOKEN_RANGE: one of draft_tokens[b, :L] is outside [0, V).

    row_max: (target.max(-1), draft.max(-1)) where the caller has them (NumPy, logits), else None.

    Returns (err [B] int32, L [B] int64, greedy [B] bool, temps [B] float64 with 1 where the
    request is greedy or its temperature is bad).
    """
    B, G1, V = target.shape
    G = G1 - 1
    temps = temps.astype(xp.float64)
    lengths = lengths.astype(xp.int64)
    err = xp.zeros(B, xp.int32)
    bad_t = ~((temps >= 0) & (temps < np.inf))
    if not greedy_ok:
        bad_t = bad_t | (temps == 0)
    err = _or(xp, err, bad_t, errors.TEMPERATURE)
    greedy = xp.ones(B, dtype=bool) if greedy_all else (temps == 0) & ~bad_t
    temps = xp.where(bad_t | greedy, 1.0, temps)
    err = _or(xp, err, (lengths < 0) | (lengths > G), errors.LENGTH)
    L = xp.clip(lengths, 0, G)
    if rows:
        t_rows = xp.arange(G1)[None, :] <= L[:, None]
        invalid, no_mass = _row_checks(target, probs, xp, row_max[0])
        err = _or(xp, err, (invalid & t_rows).any(-1), errors.TARGET_VALUES)
        err = _or(xp, err, (no_mass & t_rows).any(-1), errors.NO_MASS)
    if G:
        in_draft = xp.arange(G)[None, :] < L[:, None]
        if rows:
            d_rows = in_draft & ~greedy[:, None]
            invalid, no_mass = _row_checks(draft, probs, xp, row_max[1])
            err = _or(xp, err, (invalid & d_rows).any(-1), errors.DRAFT_VALUES)
            err = _or(xp, err, (no_mass & d_rows).any(-1), errors.NO_MASS)
        err = _or(xp, err, (((draft_tokens < 0) | (draft_tokens >= V)) & in_draft).any(-1), errors.TOKEN_RANGE)
    return err, L, greedy, temps


def _row_checks(a, probs, xp, hi=None):
    """(invalid, no_mass) of every row of a [..., V] by request_errors()' rules: invalid when the
    row holds NaN or +Inf (probs: NaN, a negative value or +Inf), no_mass when no entry is > -Inf
    (probs: in (0, +Inf))."""
    return _row_checks_max(a, probs, xp, hi)[:2]


def _row_checks_max(a, probs, xp, hi=None):
    """_row_checks() and the rows' maxima (NumPy: float32, NaN where the row holds NaN; CuPy: None)."""
    if probs:
        bad = lambda v: ~((v >= 0) & (v < np.inf))
        mass = lambda v: (v > 0) & (v < np.inf)
    else:
        bad = lambda v: ~(v < np.inf)
        mass = lambda v: v > -np.inf
    if xp is not np:   # element by element: CuPy runs this without a host synchronisation
        return bad(a).any(-1), ~mass(a).any(-1), None
    # NumPy: a row holds a bad entry exactly when its max or min (NaN propagates) is bad, and a row
    # without one has mass exactly when its max has; one or two vectorised reductions instead of
    # several element-wise passes. The rare rows with a bad entry are checked entry by entry.
    if hi is None:   # else the caller's a.max(-1) (logits)
        lo, hi = _half_row_extremes(a) if a.dtype == np.float16 else (a.min(-1) if probs else None, a.max(-1))
    invalid = bad(lo) | bad(hi) if probs else bad(hi)
    no_mass = ~mass(hi)
    if invalid.any():
        rows = np.flatnonzero(invalid)
        no_mass.reshape(-1)[rows] = ~mass(_exact_float32(a.reshape(-1, a.shape[-1])[rows])).any(-1)
    return invalid, no_mass, hi


def _half_row_extremes(a):
    """(min, max) of every row of a float16 array [..., V], as float32, NaN where the row holds
    NaN: what a.min(-1) and a.max(-1) give, from the bit patterns. NumPy's float16 reductions and
    conversions are slow scalar loops; integer ones are vectorised. Flipping the magnitude bits of
    negative numbers makes the int16 order that of the values (-0 just below +0; NaNs beyond
    +-Inf), and flipping them back turns the extreme keys into the extreme values."""
    flip = lambda k: k ^ ((k >> 15) & 0x7FFF)
    keys = flip(a.view(np.int16))
    lo, hi = keys.min(-1), keys.max(-1)
    inf_key, minus_inf_key = flip(np.array([np.inf, -np.inf], np.float16).view(np.int16))
    nan = (hi > inf_key) | (lo < minus_inf_key)
    as_float = lambda k: np.where(nan, np.float32(np.nan), flip(k).view(np.float16).astype(np.float32))
    return as_float(lo), as_float(hi)


def _exact_float32(a):
    """float16 arrays as float32: the same numbers (every float16 is a float32), while NumPy's
    float16 comparisons, reductions and argmax are slow scalar loops."""
    return a.astype(np.float32) if a.dtype == np.float16 else a


SIGMOID_MODES = ("sigmoid", "sigmoid-paper")
PAPER_FLOOR, PAPER_EPS = 1e-5, 1e-6   # the paper's clamp_min on sampling weights, its residual sum's start


def row_weights(x, temps, *, mode, sigmoid_offset, sigmoid_scale):
    """Per-row weights [B, R, V] float64 for mode 'logits' (softmax), 'probs' (the valid entries
    normalised), 'sigmoid' (sigmoid((z - offset) / scale)) or 'sigmoid-paper' (the same, 0 below
    the window t = (z - offset) / scale in [0, 1] and 1 above it). temps: [B], already 1 for greedy
    and bad requests (their rows' weights are not used for sampling)."""
    if mode == "logits":
        w, sums = _softmax_terms(x, temps)
        w /= sums
        return w
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if mode == "probs":
            x = np.where((x >= 0) & (x < np.inf), x, 0.0)
            return x / x.sum(-1, keepdims=True)
        x = x * (1.0 / temps)[:, None, None]
        if mode in SIGMOID_MODES:
            t = (x - sigmoid_offset) / sigmoid_scale
            w = 1.0 / (1.0 + np.exp(-t))
            if mode == "sigmoid-paper":
                w = np.where(t < 0, 0.0, np.where(t > 1, 1.0, w))
            return w
    raise ValueError(f"unknown mode {mode!r}")


def _softmax_terms(x, temps, out=None):
    """(w, sums) per row with w = exp(z - max z), z = float64(x) * (1 / temps), the max taken as 0
    where it is not finite: softmax (row_weights' mode 'logits') is w / sums. In fewer passes over
    the row than the plain form, bit for bit: the conversion to float64 happens inside the first
    arithmetic, the rest in place, and for float32 rows where 1 / temps is 1 (z = x) the max is
    taken before converting (the conversion is exact and keeps the order, NaN included)."""
    scale = (1.0 / temps)[:, None, None]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if x.dtype == np.float32 and (scale == 1.0).all():
            top = x.max(-1, keepdims=True).astype(np.float64)
            w = np.subtract(x, np.where(np.isfinite(top), top, 0.0), dtype=np.float64, out=out)
        else:
            w = np.multiply(x, scale, dtype=np.float64, out=out)
            top = w.max(-1, keepdims=True)
            w -= np.where(np.isfinite(top), top, 0.0)
        np.exp(w, out=w)
    return w, w.sum(-1, keepdims=True)


def _row_terms(x, temps, kw, out=None):
    """(terms, divisors) per row with row_weights(x, temps, **kw) == terms / divisors bit for bit.
    Softmax divides last by its row sums, which verification needs for the rows it samples from but
    not for the rows it reads one weight of; the other modes come whole (divisor 1, exact).
    out: float64 of x's shape for softmax's terms (else a new array)."""
    if kw["mode"] == "logits":
        return _softmax_terms(x, temps, out)
    return row_weights(x, temps, **kw), np.ones(x.shape[:-1] + (1,))


class _RowPool:
    """float64 rows [V] that one thread's verify() calls reuse (at most LIMIT bytes kept). A fresh
    array of a few hundred kB comes from the OS a page at a time, a fault each, and that cost more
    than the arithmetic: a 51865-entry softmax row took 330 us fresh among a call's kept rows and
    108 us in reused memory."""
    LIMIT = 64 << 20
    _local = threading.local()

    def __init__(self):
        self.free, self.kept = {}, 0              # (V, dtype) -> [rows], bytes held

    @classmethod
    def mine(cls) -> "_RowPool":
        pool = getattr(cls._local, "pool", None)
        if pool is None:
            pool = cls._local.pool = cls()
        return pool

    def take(self, V: int, dtype=np.float64) -> np.ndarray:
        rows = self.free.get((V, np.dtype(dtype)))
        if rows:
            self.kept -= rows[-1].nbytes
            return rows.pop()
        return np.empty(V, dtype)

    def give(self, rows) -> None:
        for row in rows:
            if self.kept + row.nbytes <= self.LIMIT:
                self.free.setdefault((row.size, row.dtype), []).append(row)
                self.kept += row.nbytes


# Acceptance reads one weight t / S of each row before the first rejection, and S, the row's float64
# sum, costs a pass of float64 exps, about twice the float32 one. In float32 (temperature 1, m the
# row's max, x - m clamped at -87 where float32 exps turn subnormal and ten times slower): x - m errs
# by at most 2^-24 |x - m| <= 5.2e-6, so terms are within 6e-6 of the float64 ones (relative, with
# the exps' few ulps), or both under 2^-125 against S >= 1 (the max's term is 1); float32 pairwise
# summation errs by under 3e-6. So S lies within SUM_SLACK of the float32 sum s (100 times the
# error), and the weight in [t / (s (1 + SUM_SLACK)), t / (s (1 - SUM_SLACK))].
SUM_SLACK = 2.0 ** -10


def _float32_terms(x, top, scratch):
    """exp(max(x - top, -87)) in float32, in scratch (SUM_SLACK's comment says why -87)."""
    w = np.maximum(np.subtract(x, top, out=scratch), -87.0, out=scratch)
    return np.exp(w, out=w)


def _softmax_bounds(x, top, col, scratch):
    """(lo, hi) around the softmax weight of entry col of a float32 row x [V] at temperature 1, top
    its max (finite): (0, t) from its exact term t alone (the sum is at least 1), or with scratch
    (float32 [V]) from the float32 sum too (SUM_SLACK)."""
    # The term as _softmax_terms() computes it, the exp in place as on its rows (NumPy runs its
    # vectorised exp only where input and output coincide or lie apart).
    t = np.subtract(x[col:col + 1], np.float64(top), dtype=np.float64)
    t = float(np.exp(t, out=t)[0])
    if scratch is None:
        return 0.0, t
    s = float(np.add.reduce(_float32_terms(x, top, scratch)))
    return t / (s * (1 + SUM_SLACK)), t / (s * (1 - SUM_SLACK))


def _softmax_race(x, top, bits, scratch):
    """The winner of the exponential race (_race()) over softmax(x), x a float32 row [V] at
    temperature 1 with max top (finite), with Philox bits [V], from float32 keys: -1 where those
    leave it open.

    A float32 key w / e (w as in _softmax_bounds(), e = -log(u) from the same uniforms, exact in
    float32, and float32 log within a few ulps, also near u = 1) is within 2e-5 of the float64 key
    times the row's sum. So an entry whose key exceeds all others by more than SUM_SLACK wins in
    float64 too, with a positive weight (its key is at least the max entry's, 1 / e >= 1 / 16.6,
    far above any entry clamped at -87)."""
    e = race_exponential(bits, dtype=np.float32)
    key = np.divide(_float32_terms(x, top, scratch), e, out=e)
    best = key.argmax()
    return int(best) if np.count_nonzero(key >= key[best] * (1 - SUM_SLACK)) == 1 else -1


# Entries of rows worth one array call: shorter rows are handled several at once (positions in
# _first_rejection, rows in _RowsOnDemand), since a call's fixed cost outweighs what verifying them
# one by one could save; longer ones one at a time (nothing after a first rejection is computed).
ROW_BLOCK = 16384


class _RowsOnDemand:
    """row_weights(x, temps) row by row: row [b, r] is computed when first read, then kept.

    Verification reads a request's rows 0..n of both models only (n: its first rejection, whose
    rows the residual reuses), so rows after n are never computed, and of rows before n one weight
    each, so those are kept undivided (_row_terms()). Every mode of row_weights() is a function of
    each row alone, so a row computed on its own is bit for bit that row of the whole array.
    Long float32 softmax rows at temperature 1 are first read through float32 bounds (bounded()),
    and computed only where those leave a decision open."""

    def __init__(self, x, temps, kw, top=None):
        self.x, self.temps, self.kw, self.top = x, temps, kw, top    # top: a _RowChecks of float32 logits
        self.done = {}                           # (b, r) -> [terms [V], divisor]
        self.pooled = []                         # rows of _RowPool's, handed back by release()
        self.scratch = None                      # float32 [V] of the float32 bounds, one of those rows
        self.float32_softmax = top is not None and 2 * x.shape[-1] > ROW_BLOCK

    def release(self) -> None:
        """Hand the rows taken from the thread's _RowPool back (nothing may read them after)."""
        _RowPool.mine().give(self.pooled)
        self.pooled, self.done, self.scratch = [], {}, None

    def bounded(self, b, i) -> bool:
        """Whether row (b, i) is read through float32 bounds (bounds(), race()): a long float32
        softmax row at temperature 1 (one at a time, as _rows() computes it), not computed yet."""
        return self.float32_softmax and (b, i) not in self.done and 1.0 / self.temps[b] == 1.0

    def _scratch(self):
        if self.scratch is None:
            self.scratch = _RowPool.mine().take(self.x.shape[-1], np.float32)
            self.pooled.append(self.scratch)
        return self.scratch

    def _rows(self, reqs, r):
        """The kept [terms, divisor] of rows (reqs[k], r[k]), computed where not kept yet."""
        keys = list(zip(reqs.tolist(), r.tolist()))
        todo = [key for key in dict.fromkeys(keys) if key not in self.done]
        # Short rows are gathered into calls of ROW_BLOCK entries (a call's fixed cost outweighs
        # the copy), long rows go one at a time as views of x (gathering would copy them).
        size = max(1, ROW_BLOCK // self.x.shape[-1])
        for group in (todo[k:k + size] for k in range(0, len(todo), size)):
            b, r = np.array(group).T
            out = None
            if len(group) > 1:
                x = self.x[b, r][:, None]
            else:
                x = self.x[b[0], r[0]][None, None]
                if self.kw["mode"] == "logits":
                    self.pooled.append(_RowPool.mine().take(x.shape[-1]))
                    out = self.pooled[-1][None, None]
            terms, divisors = _row_terms(x, self.temps[b], self.kw, out)
            self.done.update((key, [t, d]) for key, t, d in zip(group, terms[:, 0], divisors[:, 0, 0]))
        return [self.done[key] for key in keys]

    def at(self, reqs, r, cols):
        """Weights at (reqs, r, cols), index arrays of one shape."""
        rows = self._rows(reqs.ravel(), r.ravel())
        terms = np.array([t[c] for (t, _), c in zip(rows, cols.ravel().tolist())], np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (terms / np.array([d for _, d in rows], np.float64)).reshape(reqs.shape)

    def bounds(self, reqs, r, cols, *, sums=True):
        """(lo, hi) with lo <= at(reqs, r, cols) <= hi, index arrays of one shape: for bounded() rows
        from the entry's term, and with sums from float32 sums (_softmax_bounds()), the rows left
        uncomputed; lo = hi = at() for the others."""
        lo, hi = np.empty(reqs.size), np.empty(reqs.size)
        exact = []
        for k, (b, i, c) in enumerate(zip(reqs.ravel().tolist(), r.ravel().tolist(), cols.ravel().tolist())):
            if self.bounded(b, i):
                lo[k], hi[k] = _softmax_bounds(self.x[b, i], self.top.max(b, i), c, self._scratch() if sums else None)
            else:
                exact.append(k)
        if exact:
            lo[exact] = hi[exact] = self.at(reqs.flat[exact], r.flat[exact], cols.flat[exact])
        return lo.reshape(reqs.shape), hi.reshape(reqs.shape)

    def race(self, b, i, bits) -> int:
        """The race's winner in bounded() row (b, i) with Philox bits [V] from float32 keys
        (_softmax_race()), the row left uncomputed; -1 where those leave it open."""
        return _softmax_race(self.x[b, i], self.top.max(b, i), bits, self._scratch())

    def rows(self, reqs, r, *, only):
        """Rows (reqs[k], r[k]) [len(reqs), V] where only[k], 0 elsewhere. Read only: with a single
        request it is the kept row itself."""
        rows = self._rows(reqs[only], r[only])
        with np.errstate(invalid="ignore", divide="ignore"):
            for row in rows:
                if row[1] != 1.0:                # divided in place, once (x / 1 is x)
                    row[0] /= row[1]
                    row[1] = 1.0
        if len(only) == 1 and only[0]:
            return rows[0][0][None]
        out = np.zeros((len(only), self.x.shape[-1]))
        for k, (terms, _) in zip(np.flatnonzero(only), rows):
            out[k] = terms
        return out


class _RowChecks:
    """request_errors()' row checks of single rows of a [B, R, V], each computed when a decision first
    reads the row (verification validates the rows it reads, no others): the code bits of row (b, r)
    (`code` where it holds an invalid value, NO_MASS where it has no mass) and, kept with them, its
    maximum (float32 logits' bounds start from it)."""

    def __init__(self, a, probs, code):
        self.a, self.probs, self.code = a, probs, int(code)
        self.done = {}                           # (b, r) -> (bits, max)

    def _compute(self, keys):
        todo = [k for k in dict.fromkeys(keys) if k not in self.done]
        size = max(1, ROW_BLOCK // self.a.shape[-1])
        for group in (todo[k:k + size] for k in range(0, len(todo), size)):
            b, r = np.array(group).T
            rows = self.a[b[0], r[0]][None] if len(group) == 1 else self.a[b, r]
            invalid, no_mass, hi = _row_checks_max(rows, self.probs, np)
            bits = np.where(invalid, self.code, 0) | np.where(no_mass, int(errors.NO_MASS), 0)
            self.done.update((key, (int(c), h)) for key, c, h in zip(group, bits.tolist(), hi.tolist()))

    def bits(self, reqs, r):
        """Code bits [len(reqs)] int32 of rows (reqs[k], r[k])."""
        keys = list(zip(np.ravel(reqs).tolist(), np.ravel(r).tolist()))
        self._compute(keys)
        return np.array([self.done[k][0] for k in keys], np.int32).reshape(np.shape(reqs))

    def max(self, b, r):
        """Row (b, r)'s maximum (checked first, so a valid row's)."""
        self._compute([(int(b), int(r))])
        return np.float32(self.done[(int(b), int(r))][1])


def _greedy_argmax(target, greedy):
    """target.argmax(-1) [B, G+1] (first index of the maximum) in the greedy requests' rows, 0 in
    the others (they never read it). Converting to float64 first would not change it: the
    conversion is exact and keeps the order."""
    argmax = np.zeros(target.shape[:2], np.int64)
    if greedy.any():
        argmax[greedy] = _exact_float32(target[greedy]).argmax(-1)
    return argmax


def _first_rejection(accepts, L, live, step):
    """n [B]: each live request's first rejected draft position, or L when drafts 0..L-1 are all
    accepted (L for the others too). accepts(reqs, i) -> bool [len(reqs), len(i)] is asked for
    `step` positions i at a time, for the requests still verifying at i[0]."""
    n = L.copy()
    verifying = live.copy()
    end = int(L.max(initial=0))
    for start in range(0, end, step):
        reqs = np.flatnonzero(verifying & (start < L))
        if not reqs.size:
            break
        i = np.arange(start, min(start + step, end))
        rejects = ~accepts(reqs, i) & (i[None, :] < L[reqs, None])
        hit = rejects.any(-1)
        n[reqs[hit]] = i[rejects[hit].argmax(-1)]
        verifying[reqs[hit]] = False
    return n


def _residual(p_n, q_n):
    """max(0, p_n - q_n) per row [B, V], or p_n where that is all 0 (in place, one new array)."""
    with np.errstate(invalid="ignore"):
        residual = np.subtract(p_n, q_n)
        np.maximum(residual, 0.0, out=residual)
        empty = ~(residual > 0).any(-1)
    residual[empty] = p_n[empty]
    return residual


class Streams:
    """Whose Philox numbers each request draws: (seed, offset, request word) per request b, as
    arrays or scalars that index with b. Without per-request streams: the call's seed and offset
    and the row b; with streams [B, 2] (verify()'s argument): streams[b] = (seed, offset) and
    request word 0, the numbers row 0 of a one-request call with that seed and offset draws."""

    def __init__(self, seed, offset, B, streams=None):
        if streams is None:
            self.seed, self.offset, self.request = int(seed), int(offset), np.arange(B)
        else:
            streams = np.asarray(streams, np.int64)
            self.seed, self.offset, self.request = streams[:, 0], streams[:, 1], np.zeros(B, np.int64)

    def of(self, rows):
        """(seed, offset, request) of the requests `rows` (an index array)."""
        pick = lambda v: v if isinstance(v, int) else v[rows]
        return pick(self.seed), pick(self.offset), self.request[rows]


def _race(residual, rows, streams, n, purpose):
    """The exponential race in each row of residual [B, V] where rows [B] is True: the token
    argmax_j residual_j / e_j (e_j ~ Exp(1), Philox of request b's stream (Streams) at position
    n[b], index j; entries without positive weight never win) and whether no weight was positive.
    Other rows: token 0, not massless."""
    B, V = residual.shape
    token, massless = np.zeros(B, np.int64), np.zeros(B, bool)
    sel = np.flatnonzero(rows)
    if sel.size:
        seed, offset, request = streams.of(sel)
        key = race_exponential(random_row_bits(seed, offset, request, n[sel], purpose, V))
        w = residual if sel.size == B else residual[sel]
        positive = w > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(w, key, out=key)            # in place: fresh large arrays cost more than the math
        key[~positive] = -1.0
        best = key.argmax(-1)
        token[sel] = best
        massless[sel] = ~(key[np.arange(sel.size), best] > 0)    # the row's largest key
    return token, massless


def reference_verify(draft_tokens, draft, target, lengths, temps, *, mode, seed, offset,
                     race_purpose, sigmoid_offset=-10000.0, sigmoid_scale=20000.0, greedy_all=False,
                     streams=None, read_rows="decided"):
    """Returns (accepted [B], tokens [B, G+1], emitted [B], error [B]) as int32 NumPy arrays.

    streams: None (request b draws at Philox request word b, the call's seed and offset) or [B, 2]
    int64, per request (seed, offset) with request word 0 (verify()'s docstring).

    mode: 'logits' (exact), 'probs' (exact from probabilities), 'sigmoid' or 'sigmoid-paper'.
    Temperature-0 requests are greedy (accept while the draft is the target's argmax) except in
    the sigmoid modes, where temperature 0 is an error; greedy_all makes every request greedy
    (method "greedy"). A request with an error emits nothing (see request_errors()).

    Rows validated (read_rows="decided", the kernel's rule): those a decision reads. Verification
    walks positions i = 0, 1, ... < L and stops at the first that has a draft id outside [0, V),
    invalid data where it reads (exact, probs, greedy: the position's target and draft rows, their
    statistics needing the whole rows; sigmoid modes: the two token logits alone, NaN or +Inf), or a
    rejection; n is that position, or L. The rows at n (target row n, draft row n when n < L) are
    then read in full, for the residual or the bonus token, and their codes (TARGET_VALUES,
    DRAFT_VALUES, NO_MASS) are the request's, with the request-level ones (TEMPERATURE, LENGTH,
    TOKEN_RANGE of any id in [:L]). Rows past n are never read: they may hold anything.
    read_rows="all": every active row's codes as well (request_errors(rows=True)), the rule of
    truncated sampling, whose warping reads every row.

    The sigmoid modes accept draft i while u * s(q) <= s(p) (s: row_weights' sigmoid of the draft
    token's scaled logits) and at the first rejection n sample in proportion to
        'sigmoid':        max(0, s(p_n) - s(q_n)) (s(p_n) where that is all 0);
        'sigmoid-paper':  max(1e-5, max(0, s(p_n) - s(q_n)) / (1e-6 + sum_j max(0, ...)));
    and when every draft is accepted (the bonus token)
        'sigmoid':        softmax(z_L / T), exactly;
        'sigmoid-paper':  max(1e-5, z_L / T) (raw scaled logits), as the paper's released code.
    """
    B, G1, V = target.shape
    G = G1 - 1
    probs, sigmoid = mode == "probs", mode in SIGMOID_MODES
    # Request-level codes now; row codes for the rows the decisions below read (read_rows="all":
    # every active row, as truncated sampling, which reads them all, has it).
    err, L, greedy, temps = request_errors(draft_tokens, draft, target, np.asarray(lengths),
                                           np.asarray(temps, np.float64), probs=probs,
                                           greedy_ok=not sigmoid, greedy_all=greedy_all,
                                           rows=read_rows == "all")
    t_check = _RowChecks(target, probs, errors.TARGET_VALUES)
    d_check = _RowChecks(draft, probs, errors.DRAFT_VALUES)
    kw = dict(mode=mode, sigmoid_offset=sigmoid_offset, sigmoid_scale=sigmoid_scale)
    # The weights, each row computed when a step below first reads it; float32 logits' bounds start
    # from the rows' maxima, which their checks compute.
    float32_logits = mode == "logits" and target.dtype == np.float32
    p = _RowsOnDemand(target, temps, kw, t_check if float32_logits else None)
    q = _RowsOnDemand(draft, temps, kw, d_check if float32_logits else None)

    b = np.arange(B)
    x = np.clip(draft_tokens, 0, V - 1).astype(np.int64)
    draws = Streams(seed, offset, B, streams)
    u = acceptance_uniform(random_row_bits(*draws.of(b), 0, PURPOSE_ACCEPT, G))    # [B, G]
    target_argmax = _greedy_argmax(target, greedy)

    def accepts(r, at, cols):
        """Acceptance [k] of drafts cols at positions at by sampling requests r (index arrays [k],
        rows valid)."""
        ur = u[r, at]

        def decide(p_lo, p_hi, q_lo, q_hi):
            """Acceptance at the bounds' worst end, and where it differs at their best (undecided)."""
            with np.errstate(invalid="ignore"):
                sure = (p_lo > 0) & (ur * q_hi <= p_lo)
                return sure, sure != ((p_hi > 0) & (ur * q_lo <= p_hi))

        # Acceptance grows with p and falls with q. Bounds start from the entries' terms and are
        # tightened only where undecided, as the likely outcome needs: an acceptance (likely where
        # u q <= p with the terms, as if both sums were equal) needs p's float32 sum, then q's term
        # (enough when p is well above u) or its float32 sum; a rejection the float64 rows, which
        # its residual reuses.
        (p_lo, p_hi), (q_lo, q_hi) = p.bounds(r, at, cols, sums=False), q.bounds(r, at, cols, sums=False)
        likely = ur * q_hi <= p_hi
        ok_s, open_ = likely, np.ones_like(likely)
        for w, lo, hi in ((p, p_lo, p_hi), (q, q_lo, q_hi)):
            k = open_ & likely
            if k.any():
                lo[k], hi[k] = w.bounds(r[k], at[k], cols[k])
                ok_s, open_ = decide(p_lo, p_hi, q_lo, q_hi)
        if open_.any():
            p_lo[open_] = p_hi[open_] = p.at(r[open_], at[open_], cols[open_])
            q_lo[open_] = q_hi[open_] = q.at(r[open_], at[open_], cols[open_])
            ok_s = decide(p_lo, p_hi, q_lo, q_hi)[0]
        return ok_s

    def stops(reqs, i):
        """Whether verification stops [len(reqs), len(i)] at positions i of requests reqs (positions
        i < L): a draft id outside [0, V), data it reads there that is invalid (exact, greedy: the
        position's rows, checked; sigmoid: the two token logits, NaN or +Inf), or a rejection."""
        raw = draft_tokens[reqs[:, None], i]
        stop = (raw < 0) | (raw >= V)
        rr, ii = np.broadcast_arrays(reqs[:, None], i[None, :])
        live = ~stop & (ii < L[rr])
        k = np.flatnonzero(live)
        r, at = rr.flat[k], ii.flat[k]
        cols, g = x[r, at], greedy[r]
        if sigmoid:
            with np.errstate(invalid="ignore"):
                bad = ~(target[r, at, cols] < np.inf) | ~(draft[r, at, cols] < np.inf)
        else:
            bad = t_check.bits(r, at) != 0
            if (~g).any():
                bad[~g] |= d_check.bits(r[~g], at[~g]) != 0
        ok = np.zeros(k.size, bool)
        gk = ~bad & g
        ok[gk] = cols[gk] == target_argmax[r[gk], at[gk]]
        sk = ~bad & ~g
        if sk.any() and sigmoid:   # each weight a function of its entry alone: the two entries
            w = lambda a: row_weights(a[r[sk], at[sk], cols[sk]][:, None, None], temps[r[sk]], **kw)[:, 0, 0]
            px, qx = w(target), w(draft)
            ok[sk] = (px > 0) & (u[r[sk], at[sk]] * qx <= px)
        elif sk.any():
            ok[sk] = accepts(r[sk], at[sk], cols[sk])
        stop.flat[k] = ~ok
        return stop

    # Every request is verified (one with a request-level error at temperature 1 and L clamped), so
    # that its row codes are those of the rows its decisions read, as on the GPU.
    n = _first_rejection(lambda reqs, i: ~stops(reqs, i), L, np.ones(B, bool), step=max(1, ROW_BLOCK // V))
    # The rows at n are read in full (the residual or the bonus row; greedy: its argmax): their codes.
    err |= t_check.bits(b, n)
    drafted = np.flatnonzero((n < L) & ~greedy)
    if drafted.size:
        err[drafted] |= d_check.bits(drafted, n[drafted])
    sampled = (err == 0) & ~greedy                 # the requests whose weights are read

    # Bonus tokens of float32 softmax rows race on float32 keys where those decide (_softmax_race());
    # the other rows race on their float64 weights.
    quick = np.full(B, -1)
    for k in np.flatnonzero(sampled & (n >= L)):
        if p.bounded(k, n[k]):
            bits = random_row_bits(*draws.of(b[k:k + 1]), n[k:k + 1], race_purpose, V)[0]
            quick[k] = p.race(k, n[k], bits)
    raced = sampled & (quick < 0)
    token, massless = quick, np.zeros(B, bool)
    if raced.any():
        rejected = raced & (n < L)
        if mode in SIGMOID_MODES:   # a bonus row races on weights of its own (_sigmoid_race_weights)
            bonus = raced & ~rejected
            residual = _sigmoid_race_weights(mode, p.rows(b, n, only=rejected), q.rows(b, n, only=rejected),
                                             target[b[bonus], n[bonus]], temps, rejected=rejected, bonus=bonus)
        else:   # bonus rows race on p_n itself (max(0, p_n - 0): no weight is negative or NaN)
            residual = p.rows(b, n, only=raced)
            if rejected.any():   # q: 0 where n = L (no draft row)
                residual = _residual(residual, q.rows(b, n, only=rejected))
        raced_token, massless = _race(residual, raced, draws, n, race_purpose)
        token = np.where(raced, raced_token, token)
    p.release()
    q.release()
    token = np.where(greedy, target_argmax[b, n], token)
    # No positive weight left in row n (only float underflow gets here without another error).
    err = _or(np, err, sampled & massless, errors.NO_MASS)

    return verify_outputs(draft_tokens, n, token, err)


def verify_outputs(draft_tokens, n, token, err):
    """(accepted, tokens [B, G+1], emitted, error) int32 from the first rejection n [B], the emitted
    token [B] and the error codes [B]: the accepted drafts, the token at n, -1 after; a request with
    an error gets accepted -1, emitted 0 and tokens -1."""
    B, G = draft_tokens.shape
    b = np.arange(B)
    tokens = np.full((B, G + 1), -1, np.int32)
    tokens[:, :G] = np.where(np.arange(G)[None, :] < n[:, None], draft_tokens, -1)
    tokens[b, n] = token
    accepted = n.astype(np.int32)
    failed = err != 0
    tokens[failed] = -1
    accepted[failed] = -1
    return accepted, tokens, (accepted + 1) * ~failed, err


def _sigmoid_race_weights(mode, p_n, q_n, z_bonus, temps, *, rejected, bonus):
    """The sigmoid modes' sampling weights of row n [B, V] (reference_verify's docstring) of the rows
    that race: rejected ones from p_n = s(p_n) and q_n = s(q_n) ([B, V], read there), bonus ones from
    z_bonus [bonus.sum(), V], the target's logits of those rows; 0 in the other rows. Each row's
    weights come from that row alone, and only the kind it races on is computed."""
    out = np.zeros(p_n.shape)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if mode == "sigmoid":
            if rejected.any():
                out[rejected] = _residual(p_n[rejected], q_n[rejected])
            if bonus.any():
                out[bonus] = row_weights(z_bonus[:, None, :], temps[bonus], mode="logits",
                                         sigmoid_offset=0.0, sigmoid_scale=1.0)[:, 0]
            return out
        if rejected.any():   # no fallback: an all-zero residual leaves the 1e-5 floor alone
            diff = np.maximum(p_n[rejected] - q_n[rejected], 0.0)
            out[rejected] = diff / (PAPER_EPS + diff.sum(-1, keepdims=True))
        if bonus.any():
            out[bonus] = z_bonus.astype(np.float64) / temps[bonus][:, None]
        return np.maximum(out, PAPER_FLOOR, out=out)
