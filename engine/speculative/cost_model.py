"""Step cost as a linear function of what a step computes, fitted online from the engine's own timings.

``t = a + b * tokens + c * sampled_rows`` (plus whatever features a proposer adds), by exponentially
weighted ridge least squares: recent steps count most, so the model follows the load of a shared
host. Prefill chunks (many tokens, one sampled row) and decode steps (one token per row) make the
token and row costs separable; verified runs are both a token and a sampled row per draft.
"""

from __future__ import annotations

import numpy as np

DECAY = 0.98  # per observed step: the fit remembers about the last 50 steps
RIDGE = 1e-3  # keeps the solve defined before the features vary; the intercept is not shrunk


class LinearCost:
    def __init__(self, num_features: int) -> None:
        self.n = num_features + 1
        self.xtx = np.zeros((self.n, self.n))
        self.xty = np.zeros(self.n)
        self.weight = 0.0
        self.observations = 0
        self._coef: np.ndarray | None = None

    def observe(self, features: list[float], seconds: float) -> None:
        x = np.array([1.0, *features])
        self.xtx = DECAY * self.xtx + np.outer(x, x)
        self.xty = DECAY * self.xty + seconds * x
        self.weight = DECAY * self.weight + 1.0
        self.observations += 1
        self._coef = None

    @property
    def coef(self) -> np.ndarray:
        if self._coef is None:
            scale = np.maximum(np.diag(self.xtx), 1e-12)
            ridge = RIDGE * np.diag(scale)
            ridge[0, 0] = 0.0
            try:
                coef = np.linalg.solve(self.xtx + ridge + 1e-12 * np.eye(self.n), self.xty)
            except np.linalg.LinAlgError:
                coef = np.zeros(self.n)
            self._coef = np.maximum(coef, 0.0)  # no feature makes a step cheaper
        return self._coef

    def predict(self, features: list[float]) -> float:
        return float(self.coef @ np.array([1.0, *features]))

    @property
    def ready(self) -> bool:
        """Enough steps to trust the fixed cost. A slope not yet seen reads as 0 (clipped), so the
        first plans speculate a little and the steps they produce teach the fit what a draft costs."""
        return self.observations >= 8
