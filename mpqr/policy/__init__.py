"""Precision policy: settings, options, engine decisions and the explain trace."""

from mpqr.policy.options import GemmOptions, as_gemm_options
from mpqr.policy.policy import (
    Decision,
    active_gemm_options,
    decide,
    double_double_gram,
    fused_gemm,
    gemm,
    gemm_add,
    gemm_into,
    gemm_options,
    gemm_sub,
    gram,
    prepare_operand,
    result_dtype,
)
from mpqr.policy.precision import (
    PRECISIONS,
    get_precision,
    precision,
    resolve_precision,
    set_precision,
    validate_precision,
)
from mpqr.policy.trace import Event, GemmDecision, Trace, explain, record_event, record_gemm

__all__ = [
    "PRECISIONS",
    "Decision",
    "Event",
    "GemmDecision",
    "GemmOptions",
    "Trace",
    "active_gemm_options",
    "as_gemm_options",
    "decide",
    "double_double_gram",
    "explain",
    "fused_gemm",
    "gemm",
    "gemm_add",
    "gemm_into",
    "gemm_options",
    "gemm_sub",
    "get_precision",
    "gram",
    "precision",
    "prepare_operand",
    "record_event",
    "record_gemm",
    "resolve_precision",
    "result_dtype",
    "set_precision",
    "validate_precision",
]
