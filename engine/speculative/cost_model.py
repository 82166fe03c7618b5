"""Step cost as a linear function of what a step computes, fitted online from the engine's own timings.

``t = a + b * tokens + c * sampled_rows`` (plus whatever features a proposer adds), by exponentially
weighted ridge least squares: recent steps count most, so the model follows the load of a shared
host. Prefill chunks (many tokens, one sampled row) and decode steps (one token per row) make the
token and row costs separable; verified runs are both a token and a sampled row per draft.

The normal equations are a handful of numbers, kept and solved in plain Python: the fit is updated
and solved once per engine step, right after the model's matmuls, where numpy's per-call overhead
on cold caches cost about 0.1 ms a step (batch 64 on a 2-core CPU), more than the arithmetic.
"""

from __future__ import annotations

DECAY = 0.98  # per observed step: the fit remembers about the last 50 steps
RIDGE = 1e-3  # keeps the solve defined before the features vary; the intercept is not shrunk


def solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """``x`` with ``a @ x == b`` by Gaussian elimination with partial pivoting; None if singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        head = m[col]
        for r in range(col + 1, n):
            f = m[r][col] / head[col]
            if f:
                row = m[r]
                for c in range(col, n + 1):
                    row[c] -= f * head[c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


class LinearCost:
    def __init__(self, num_features: int) -> None:
        self.n = num_features + 1
        self.xtx = [[0.0] * self.n for _ in range(self.n)]
        self.xty = [0.0] * self.n
        self.weight = 0.0
        self.observations = 0
        self._coef: list[float] | None = None

    def observe(self, features: list[float], seconds: float) -> None:
        x = [1.0, *features]
        for i, xi in enumerate(x):
            row = self.xtx[i]
            for j, xj in enumerate(x):
                row[j] = DECAY * row[j] + xi * xj
            self.xty[i] = DECAY * self.xty[i] + seconds * xi
        self.weight = DECAY * self.weight + 1.0
        self.observations += 1
        self._coef = None

    @property
    def coef(self) -> list[float]:
        if self._coef is None:
            a = [row[:] for row in self.xtx]
            for i in range(self.n):
                a[i][i] += 1e-12 + (RIDGE * max(self.xtx[i][i], 1e-12) if i else 0.0)
            coef = solve(a, self.xty) or [0.0] * self.n
            self._coef = [max(c, 0.0) for c in coef]  # no feature makes a step cheaper
        return self._coef

    def predict(self, features: list[float]) -> float:
        return sum(c * x for c, x in zip(self.coef, [1.0, *features]))

    @property
    def ready(self) -> bool:
        """Enough steps to trust the fixed cost. A slope not yet seen reads as 0 (clipped), so the
        first plans speculate a little and the steps they produce teach the fit what a draft costs."""
        return self.observations >= 8
