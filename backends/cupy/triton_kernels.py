"""Triton kernels of the CuPy backend (imported only where Triton is installed; the
launchers and their fallbacks are in :mod:`mpqr.backends.cupy.triton_gemm`)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["fp16_gemm", "sgemm_split"]


@triton.jit
def _pow2(e):
    # 2**e for -126 <= e <= 127, exactly (the float's exponent field)
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _unscale(x, e):
    # x * 2**e for -330 <= e <= 330 in three exact factors: the products are exact
    # unless the result is a float32 subnormal (then within one subnormal step)
    e1 = e // 3
    e2 = (e - e1) // 2
    return ((x * _pow2(e1)) * _pow2(e2)) * _pow2(e - e1 - e2)


@triton.jit
def fp16_gemm(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K,
              s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
              ACCUMULATE: tl.constexpr, SUBTRACT: tl.constexpr, WIDE: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              GROUP_M: tl.constexpr):
    # C (=, +=, -=) 2**-(sa_i + sb_j) (A16 B16)_ij for fp16 operands scaled by the engine
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    # grouped order: GROUP_M row tiles share their B tiles in L2
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if WIDE:  # 64-bit offsets for operands that span 2**31 elements
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
        rk = rk.to(tl.int64)
    mask_m = rm < M
    mask_n = rn < N
    a_ptrs = a_ptr + rm[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rk[:, None] * s_bk + rn[None, :] * s_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        mask_k = rk < K - kt * BK
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK * s_ak
        b_ptrs += BK * s_bk
    sa = tl.load(sa_ptr + rm, mask=mask_m, other=0)
    sb = tl.load(sb_ptr + rn, mask=mask_n, other=0)
    p = _unscale(acc, -(sa[:, None] + sb[None, :]))
    c_ptrs = c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn
    mask = mask_m[:, None] & mask_n[None, :]
    if ACCUMULATE:
        c = tl.load(c_ptrs, mask=mask, other=0.0)
        if SUBTRACT:
            p = c - p
        else:
            p = c + p
    tl.store(c_ptrs, p, mask=mask)


@triton.jit
def _slice(acc, ah_ptrs, bh_ptrs, mask_m, mask_n, rk, k_left, s_ahk, s_bhk,
           SLICE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # one k-slice of hi hi summed on the tensor cores, then added to acc (round-to-nearest)
    part = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, SLICE // BK):
        mask_k = rk < k_left - kt * BK
        a = tl.load(ah_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(bh_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        part = tl.dot(a, b, part)
        ah_ptrs += BK * s_ahk
        bh_ptrs += BK * s_bhk
    return acc + part, ah_ptrs, bh_ptrs


@triton.jit
def sgemm_split(ah_ptr, af_ptr, al_ptr, bh_ptr, bf_ptr, bl_ptr, c_ptr, sa_ptr, sb_ptr,
                M, N, K, s_ahm, s_ahk, s_apm, s_apk, s_bhk, s_bhn, s_bpk, s_bpn, s_cm, s_cn,
                ACCUMULATE: tl.constexpr, SUBTRACT: tl.constexpr, WIDE: tl.constexpr,
                SLICE: tl.constexpr, LO_SCALE: tl.constexpr, FLATTEN: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                GROUP_M: tl.constexpr):
    # C (=, +=, -=) 2**-(sa_i + sb_j) P_ij for the tc-sgemm product of split operands:
    # P = LO_SCALE (hf_A lo_B + lo_A hf_B) first (one tensor-core sum over k), then each
    # SLICE-long k-slice of hi_A hi_B summed on the tensor cores and added to P with
    # round-to-nearest: the engine's order (C = corrections; C += slice, slice by slice)
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if WIDE:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
        rk = rk.to(tl.int64)
    mask_m = rm < M
    mask_n = rn < N
    # the corrections
    af_ptrs = af_ptr + rm[:, None] * s_apm + rk[None, :] * s_apk
    al_ptrs = al_ptr + rm[:, None] * s_apm + rk[None, :] * s_apk
    bf_ptrs = bf_ptr + rk[:, None] * s_bpk + rn[None, :] * s_bpn
    bl_ptrs = bl_ptr + rk[:, None] * s_bpk + rn[None, :] * s_bpn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        mask_k = rk < K - kt * BK
        ma = mask_m[:, None] & mask_k[None, :]
        mb = mask_k[:, None] & mask_n[None, :]
        a = tl.load(af_ptrs, mask=ma, other=0.0)
        b = tl.load(bl_ptrs, mask=mb, other=0.0)
        acc = tl.dot(a, b, acc)
        a = tl.load(al_ptrs, mask=ma, other=0.0)
        b = tl.load(bf_ptrs, mask=mb, other=0.0)
        acc = tl.dot(a, b, acc)
        af_ptrs += BK * s_apk
        al_ptrs += BK * s_apk
        bf_ptrs += BK * s_bpk
        bl_ptrs += BK * s_bpk
    acc = acc * LO_SCALE
    # hi hi, slice by slice
    ah_ptrs = ah_ptr + rm[:, None] * s_ahm + rk[None, :] * s_ahk
    bh_ptrs = bh_ptr + rk[:, None] * s_bhk + rn[None, :] * s_bhn
    if FLATTEN:  # one pipelined loop over the nest (a Triton without it: the else)
        for ks in tl.range(0, tl.cdiv(K, SLICE), flatten=True):
            acc, ah_ptrs, bh_ptrs = _slice(acc, ah_ptrs, bh_ptrs, mask_m, mask_n, rk,
                                           K - ks * SLICE, s_ahk, s_bhk, SLICE, BM, BN, BK)
    else:
        for ks in range(0, tl.cdiv(K, SLICE)):
            acc, ah_ptrs, bh_ptrs = _slice(acc, ah_ptrs, bh_ptrs, mask_m, mask_n, rk,
                                           K - ks * SLICE, s_ahk, s_bhk, SLICE, BM, BN, BK)
    sa = tl.load(sa_ptr + rm, mask=mask_m, other=0)
    sb = tl.load(sb_ptr + rn, mask=mask_n, other=0)
    p = _unscale(acc, -(sa[:, None] + sb[None, :]))
    c_ptrs = c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn
    mask = mask_m[:, None] & mask_n[None, :]
    if ACCUMULATE:
        c = tl.load(c_ptrs, mask=mask, other=0.0)
        if SUBTRACT:
            p = c - p
        else:
            p = c + p
    tl.store(c_ptrs, p, mask=mask)
