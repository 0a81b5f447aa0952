"""benchmarks/quant_sass.py: instructions per element of the encoders, read off cuobjdump -sass text."""
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
sys.path.insert(0, BENCH)

import quant_sass  # noqa: E402

# NF4 (4), bf16, vectors, 4096-element tiles, the direct table, blocks of 2^6, 512 threads.
NF4_BF16 = "_ZN7vramkit5quant12_GLOBAL__N_113encode_kernelILi4E13__nv_bfloat16Lb1ELi4096ELb1ELi6ELi512EEEvPKT0_liPhPf"
# INT8 (0): not a table format, left out by default.
INT8_F32 = "_ZN7vramkit5quant12_GLOBAL__N_113encode_kernelILi0EfLb1ELi4096ELb0ELi8ELi128EEEvPKT0_liPhPf"


def sass(name, turns, body=5, loads=2):
    """A function whose loop loads the next tile (a group of `loads` predicated 16-byte loads)
    every `body` + `loads` instructions, `turns` times."""
    lines = [f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90\""]
    addr = 0

    def ins(text):
        nonlocal addr
        lines.append(f"        /*{addr:04x}*/                   {text} ;  /* 0x000000000000 */")
        addr += 16

    ins("S2R R0, SR_TID.X")
    ins("LDG.E.128.CONSTANT R4, desc[UR4][R2.64]")  # a first load not under @!P: not a turn's start
    for _ in range(turns):
        for k in range(loads):
            ins(f"@!P0 LDG.E.128 R{8 + 4 * k}, desc[UR4][R12.64+0x{16 * k:x}]")
        for _ in range(body):
            ins("FMUL R1, R2, R3")
    ins("EXIT")
    return "\n".join(lines) + "\n"


def test_counts_one_turn_of_the_loop_per_element():
    rows = quant_sass.encoder_rows(sass(NF4_BF16, turns=3, body=30, loads=2) + sass(INT8_F32, turns=3))
    assert len(rows) == 1  # INT8 is not a table format
    r = rows[0]
    assert (r["format"], r["dtype"], r["table"], r["block"], r["threads"]) == ("nf4", "bfloat16", "direct", "2^6", 512)
    assert r["instructions"] == 32 and r["elements"] == 8 and r["per_element"] == pytest.approx(4.0)
    assert quant_sass.encoder_rows(sass(INT8_F32, turns=3, body=62), formats=(0,))[0]["per_element"] == pytest.approx(2.0)


def test_a_kernel_without_a_loop_has_no_count():
    r = quant_sass.encoder_rows(sass(NF4_BF16, turns=1, body=30))[0]
    assert r["instructions"] is None and r["per_element"] is None
    # loads a few instructions apart are one group (one tile's vectors), not turns
    r = quant_sass.encoder_rows(sass(NF4_BF16, turns=4, body=3))[0]
    assert r["instructions"] is None


def test_command_line(tmp_path, capsys):
    f = tmp_path / "k.sass"
    f.write_text(sass(NF4_BF16, turns=2, body=22))
    assert quant_sass.main([str(f)]) == 0
    out = capsys.readouterr().out
    assert "| nf4 | bfloat16 | 2^6 | direct | 4096 | 512 | 24 | 8 | 3.00 |" in out
    empty = tmp_path / "none.sass"
    empty.write_text("")
    assert quant_sass.main([str(empty)]) == 1
    with pytest.raises(SystemExit):
        quant_sass.main([str(f), "--formats", "nf5"])


def test_instruction_mix_of_a_turn(capsys, tmp_path):
    # one turn: 2 predicated loads and 30 FMULs, over 8 elements a thread
    r = quant_sass.encoder_rows(sass(NF4_BF16, turns=3, body=30, loads=2))[0]
    assert r["mix"] == {"LDG": 2, "FMUL": 30}
    assert quant_sass.opcode("@!P0 LDG.E.128 R8, desc[UR4][R12.64]") == "LDG"
    assert quant_sass.opcode("SHFL.BFLY PT, R1, R2, 0x1, 0x1f") == "SHFL"
    assert quant_sass.encoder_rows(sass(NF4_BF16, turns=1, body=30))[0]["mix"] == {}
    f = tmp_path / "k.sass"
    f.write_text(sass(NF4_BF16, turns=2, body=22))
    assert quant_sass.main([str(f), "--mix", "2"]) == 0
    assert "|  | FMUL 2.75, LDG 0.25 |" in capsys.readouterr().out
