"""The A/B baseline of LiteRT's static int8 layers: a copy of a LiteRT export whose target graph runs each layer
that static_int8.py made int8 (QUANTIZE -> FULLY_CONNECTED -> DEQUANTIZE) on the dynamic-range kernel again, the
float rounding around it kept: the graphs as mtpkit wrote them before, to time against (tools/call_costs.py) or
measure (mtpkit quant-report) in one run. The other files are hard links. Not in CI.

    .venv/bin/python tools/static_int8_ab.py EXPORT OUT
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np


def dynamic(model) -> int:
    """Undo static_int8.apply in the flatbuffer object `model`: each int8 FULLY_CONNECTED reads its QUANTIZE's
    float input and writes its DEQUANTIZE's float output, those ops and int8 tensors gone; returns how many."""
    from ai_edge_litert import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    op_name = [names[max(c.builtinCode, c.deprecatedBuiltinCode)] for c in model.operatorCodes]
    undone = 0
    for g, sg in enumerate(model.subgraphs):
        makes = {int(o.outputs[0]): o for o in sg.operators if op_name[o.opcodeIndex] == "QUANTIZE"}
        reads = {int(o.inputs[0]): o for o in sg.operators if op_name[o.opcodeIndex] == "DEQUANTIZE"}
        gone, dropped = set(), set()
        for o in sg.operators:
            if op_name[o.opcodeIndex] == "FULLY_CONNECTED" and int(o.inputs[0]) in makes:
                q, dq = makes[int(o.inputs[0])], reads[int(o.outputs[0])]
                gone |= {int(o.inputs[0]), int(o.outputs[0])}
                o.inputs = np.array([int(q.inputs[0]), *o.inputs[1:]], np.int32)
                o.outputs = np.array([int(dq.outputs[0])], np.int32)
                dropped |= {id(q), id(dq)}
                undone += 1
        sg.operators = [o for o in sg.operators if id(o) not in dropped]
        _drop_tensors(model, g, gone)
    return undone


def _drop_tensors(model, g: int, gone: set[int]) -> None:
    sg = model.subgraphs[g]
    remap, kept = {}, []
    for i, t in enumerate(sg.tensors):
        if i not in gone:
            remap[i] = len(kept)
            kept.append(t)

    def moved(ix):
        return np.array([remap[int(x)] if int(x) >= 0 else -1 for x in ix], np.int32)

    for o in sg.operators:
        o.inputs, o.outputs = moved(o.inputs), moved(o.outputs)
    sg.inputs, sg.outputs, sg.tensors = moved(sg.inputs), moved(sg.outputs), kept
    for sig in model.signatureDefs or []:
        if sig.subgraphIndex == g:
            for io in [*sig.inputs, *sig.outputs]:
                io.tensorIndex = remap[io.tensorIndex]


def main(argv: list[str] | None = None) -> int:
    from ai_edge_litert import schema_py_generated as schema

    from mtpkit.export.backends.litert.graft import _pack, read_map

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path)
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    manifest = json.loads((args.export / "manifest.json").read_text())
    target = manifest["backends"]["litert"]["graphs"]["target"]
    args.out.mkdir(parents=True)
    for f in args.export.iterdir():
        if f.is_file() and f.name != target["file"] and "xnnpack_cache" not in f.name:
            os.link(f, args.out / f.name)
    src = args.export / target["file"]
    model = schema.ModelT.InitFromPackedBuf(read_map(src), 0)
    head = len(_pack(model))
    print(f"{dynamic(model)} int8 layers back on the dynamic-range kernel")
    packed = _pack(model)
    assert len(packed) <= head  # fewer ops and tensors: the weights' offsets past the flatbuffer still hold
    with open(src, "rb") as fin, open(args.out / target["file"], "wb") as fout:
        fout.write(packed)
        fin.seek(len(packed))
        shutil.copyfileobj(fin, fout, 16 << 20)
    # the runtime checks each graph's bytes against the manifest: this copy records its own
    from mtpkit.runtime.manifest import sha256_file

    written = args.out / target["file"]
    target["sha256"], target["bytes"] = sha256_file(written), written.stat().st_size
    (args.out / "manifest.json").unlink()
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
