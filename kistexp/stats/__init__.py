"""Statistics shared by the plan linter and the rollback judge.

This package imports nothing from kistexp: the linter (a lower layer) and the judge
(a higher one) both use it, so the power the linter forecasts is computed with the
same boundaries the judge applies.
"""
