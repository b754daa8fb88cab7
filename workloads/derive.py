"""Rebuild every shipped workload file from the raw public traces.

    python -m workloads.derive --raw-dir ../shared/workloads/raw [--out workloads/data]

The raw directory may be our ../shared copy or the user's own download: each source file is found by its
upstream file name anywhere under --raw-dir. Output is deterministic (gzip mtime 0, sorted keys), so a rerun
on the same raw files reproduces the shipped bytes. Raw traces are never committed; only these derived files.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workloads.loaders import load_azure_csv, load_mooncake_jsonl, load_table
from workloads.servegen import QUANTILE_LEVELS, derive_servegen
from workloads.spec import RequestSpec
from workloads.stats import arrival_stats, correlation, percentiles, prefix_reuse

FORMAT = "servelab-workload/1"
DATA_DIR = Path(__file__).parent / "data"
LLAMA2 = "Llama-2 tokenizer (per the source)"
UNNAMED = "not published (presumably the production model's own tokenizer)"
AZURE_ATTRIBUTION = "Azure LLM inference trace 2023; cite Patel et al., 'Splitwise', ISCA 2024"


@dataclass(frozen=True)
class MixSource:
    name: str
    label: str  # short source name for tables
    file_name: str
    loader: Callable[[Path], list[RequestSpec]]
    repository: str
    path: str
    commit: str
    licence: str
    attribution: str
    tokenizer: str
    description: str
    arrival_windows_s: tuple[float, ...] = (1, 10, 60)


MIX_SOURCES = (
    MixSource(
        "azure-code-2023",
        "Azure 2023 code",
        "AzureLLMInferenceTrace_code.csv",
        load_azure_csv,
        "Azure/AzurePublicDataset",
        "data/AzureLLMInferenceTrace_code.csv",
        "790921015d50dd6aae7f7e47f39ba0e235ad6b08",
        "CC-BY-4.0 (data)",
        AZURE_ATTRIBUTION,
        UNNAMED,
        "Azure coding service, 1 h: long prompts (4.7 % near the 7,437 cap), tiny outputs, extremely bursty",
    ),
    MixSource(
        "azure-conv-2023",
        "Azure 2023 conv",
        "AzureLLMInferenceTrace_conv.csv",
        load_azure_csv,
        "Azure/AzurePublicDataset",
        "data/AzureLLMInferenceTrace_conv.csv",
        "790921015d50dd6aae7f7e47f39ba0e235ad6b08",
        "CC-BY-4.0 (data)",
        AZURE_ATTRIBUTION,
        UNNAMED,
        "Azure chat service, 1 h: ~1k-token prompts, ~130-token outputs, near-Poisson at second scale",
    ),
    MixSource(
        "mooncake-conversation",
        "Mooncake FAST25",
        "conversation_trace.jsonl",
        load_mooncake_jsonl,
        "kvcache-ai/Mooncake",
        "FAST25-release/traces/conversation_trace.jsonl",
        "3cca71daccf2a7afb8fe3f0295358f70e3a69fdb",
        "Apache-2.0",
        "Mooncake (Kimi / Moonshot AI), FAST'25 conversation trace",
        UNNAMED,
        "Kimi chat, 1 h: long multi-turn contexts with 512-token prefix hash ids; arrivals in 3 s ticks",
        (3, 10, 60),
    ),
    MixSource(
        "sharegpt",
        "Etalon ShareGPT",
        "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        load_table,
        "project-etalon/etalon",
        "data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        "10102d06d17e7763a9779b0483b41abd7fabeb3b",
        "Apache-2.0 (lengths only; ShareGPT text has its own terms)",
        "Etalon / Sarathi-Serve processed ShareGPT trace (sharegpt_8k)",
        LLAMA2,
        "ShareGPT conversations <= 8k tokens (prefill includes history), lengths only",
    ),
    MixSource(
        "arxiv-summarization",
        "Vidur arXiv",
        "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        load_table,
        "microsoft/vidur",
        "data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        "6d98aa8f71696520acc603d87439e77cc78160a7",
        "MIT (lengths only; arXiv dataset has its own terms)",
        "Vidur (Microsoft) Arxiv-Summarization-4K",
        LLAMA2,
        "arXiv summarisation <= 4k: long prompts, short outputs, lengths only",
    ),
    MixSource(
        "bwb-translation",
        "Etalon BWB",
        "bwb_stats_llama2_tokenizer_filtered_v2.csv",
        load_table,
        "project-etalon/etalon",
        "data/processed_traces/bwb_stats_llama2_tokenizer_filtered_v2.csv",
        "10102d06d17e7763a9779b0483b41abd7fabeb3b",
        "Apache-2.0 (lengths only; BWB dataset has its own terms)",
        "Etalon processed Bilingual Web Book trace",
        LLAMA2,
        "document translation: output tracks input (Pearson 0.78), long outputs, lengths only",
    ),
    MixSource(
        "lmsys",
        "APEX+ LMSYS",
        "lmsys_05.jsonl.lengths_only.csv",
        load_table,
        "microsoft/apex_plus",
        "traces/llama/lmsys_05.jsonl",
        "d96aa5fa97a8b69e2a80cfdc8d9b986d060f9d3f",
        "MIT (APEX+); token counts only, no LMSYS-Chat-1M text is shipped (LMSYS-Chat-1M has its own licence)",
        "APEX+ (Microsoft) LMSYS-Chat-1M 1,024-request sample",
        "Llama tokenizer (per the source)",
        "LMSYS-Chat-1M first turns: very short prompts, moderate outputs; upstream times are synthetic, dropped",
    ),
)


@dataclass(frozen=True)
class ServeGenSource:
    name: str
    label: str
    model_dir: str  # e.g. "reason/deepseek-r1" under ServeGen's data/
    description: str


SERVEGEN_REPOSITORY = ("alibaba/ServeGen", "aa743362c095bc690daa3f6f70d665ea474dc0b7")
SERVEGEN_SOURCES = (
    ServeGenSource(
        "servegen-deepseek-r1",
        "ServeGen R1",
        "reason/deepseek-r1",
        "Alibaba Bailian DeepSeek-R1, 1 day, 73 clients: short prompts, long reasoning outputs (p90 3.4k); "
        "marginals only, diurnal rate curve",
    ),
)


def _hash_id_runs(ids: list[int]) -> list[int]:
    """[start, length, start, length, ...]: Mooncake ids are mostly consecutive runs, so this is ~20x smaller."""
    runs: list[int] = []
    for hash_id in ids:
        if runs and runs[-2] + runs[-1] == hash_id:
            runs[-1] += 1
        else:
            runs += [hash_id, 1]
    return runs


def derive_mix(source: MixSource, raw_file: Path) -> dict:
    """The shipped document for one source: all rows (lengths, arrivals, prefix ids) plus its statistics."""
    specs = source.loader(raw_file)
    inputs = [spec.input_len for spec in specs]
    outputs = [spec.output_len for spec in specs]
    columns: dict[str, list] = {"input_len": inputs, "output_len": outputs}
    derivation = f"all {len(specs)} rows of {source.file_name} in trace order, token counts unchanged"
    arrivals = None
    if specs[0].timestamp is not None:
        micros = [round(spec.timestamp * 1e6) for spec in specs]  # type: ignore[operator]
        columns["timestamp_delta_us"] = [micros[0]] + [b - a for a, b in zip(micros, micros[1:], strict=False)]
        arrivals = arrival_stats([spec.timestamp for spec in specs], source.arrival_windows_s)  # type: ignore[misc]
        derivation += "; timestamps rebased to the first request, stored as microsecond deltas"
    prefix = None
    if specs[0].prefix_ids is not None:
        block_size = specs[0].prefix_block_size or 0
        columns["hash_id_runs"] = [_hash_id_runs(spec.prefix_ids or []) for spec in specs]
        prefix = prefix_reuse([spec.prefix_ids or [] for spec in specs], inputs, block_size)
        derivation += "; hash_ids stored as [start, length] runs of consecutive ids"
    return {
        "format": FORMAT,
        "name": source.name,
        "description": source.description,
        "source": {"repository": source.repository, "path": source.path, "commit": source.commit},
        "source_label": source.label,
        "licence": source.licence,
        "attribution": source.attribution,
        "tokenizer": source.tokenizer,
        "token_counts": "as published by the source (its tokenizer); used unchanged as request sizes",
        "rows": len(specs),
        "derivation": derivation + " (python -m workloads.derive)",
        "percentile_method": "numpy linear interpolation between order statistics",
        "source_percentiles": {"input_len": percentiles(inputs), "output_len": percentiles(outputs)},
        "correlation": correlation(inputs, outputs),
        "arrivals": arrivals,
        "prefix": prefix,
        "columns": columns,
    }


def derive_servegen_mix(source: ServeGenSource, model_dir: Path) -> dict:
    """The shipped document for a ServeGen model: quantile tables and the aggregate rate curve."""
    derived = derive_servegen(model_dir)
    return {
        "format": FORMAT,
        "name": source.name,
        "description": source.description,
        "source": {
            "repository": SERVEGEN_REPOSITORY[0],
            "path": f"data/{source.model_dir}",
            "commit": SERVEGEN_REPOSITORY[1],
        },
        "source_label": source.label,
        "licence": "Apache-2.0",
        "attribution": "Alibaba ServeGen (Bailian); cite Xiang et al., 'ServeGen', arXiv:2505.09999",
        "tokenizer": UNNAMED,
        "token_counts": "as published by the source (its tokenizer); used unchanged as request sizes",
        "rows": QUANTILE_LEVELS,
        "derivation": (
            f"rate x window weighted mixture of {derived['clients']} clients' length PMFs (volume coverage "
            f"{derived['dataset_volume_coverage']:.0%}), stored as inverse CDFs at k/{QUANTILE_LEVELS}; input and "
            "output independent (no joint distribution published) (python -m workloads.derive)"
        ),
        "resolution": f"quantile table: 1/{QUANTILE_LEVELS} of probability (0.1 percentage point)",
        "percentile_method": "discrete inverse CDF of the mixture PMF",
        "source_percentiles": derived["source_percentiles"],
        "correlation": None,
        "arrivals": derived["arrivals"],
        "prefix": None,
        "columns": derived["columns"],
    }


def find_model_dir(raw_dir: Path, model_dir: str) -> Path | None:
    leaf = model_dir.split("/")[-1]
    matches = sorted(p for p in raw_dir.rglob(leaf) if p.is_dir() and any(p.glob("chunk-*-trace.csv")))
    return matches[0] if matches else None


def write_document(document: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{document['name']}.json.gz"
    payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        gz.write(payload)
    return path


def find_raw_file(raw_dir: Path, file_name: str) -> Path | None:
    matches = sorted(raw_dir.rglob(file_name))
    return matches[0] if matches else None


def derive_all(raw_dir: Path, out_dir: Path, names: list[str] | None = None) -> list[Path]:
    from rich.progress import Progress

    every = MIX_SOURCES + SERVEGEN_SOURCES
    sources = [source for source in every if names is None or source.name in names]
    if names is not None and len(sources) != len(names):
        known = [source.name for source in every]
        raise SystemExit(f"unknown mix name(s) in {names}; derivable mixes are {known}")
    written: list[Path] = []
    with Progress() as progress:
        task = progress.add_task("deriving workloads", total=len(sources))
        for source in sources:
            if isinstance(source, ServeGenSource):
                raw_file, wanted = find_model_dir(raw_dir, source.model_dir), source.model_dir
            else:
                raw_file, wanted = find_raw_file(raw_dir, source.file_name), source.file_name
            if raw_file is None:
                progress.console.print(f"[yellow]skip {source.name}: {wanted} not found under {raw_dir}")
            else:
                if isinstance(source, ServeGenSource):
                    document = derive_servegen_mix(source, raw_file)
                else:
                    document = derive_mix(source, raw_file)
                path = write_document(document, out_dir)
                progress.console.print(f"{source.name}: {path.name} ({path.stat().st_size / 1024:.0f} KiB)")
                written.append(path)
            progress.advance(task)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workloads.derive", description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw-dir", type=Path, required=True, help="directory holding the raw trace files")
    parser.add_argument("--out", type=Path, default=DATA_DIR, help=f"output directory (default {DATA_DIR})")
    parser.add_argument("--only", nargs="*", help="derive only these mix names")
    args = parser.parse_args(argv)
    if not args.raw_dir.is_dir():
        raise SystemExit(f"--raw-dir {args.raw_dir} is not a directory")
    written = derive_all(args.raw_dir, args.out, args.only)
    if not written:
        raise SystemExit(f"no raw trace files found under {args.raw_dir}")


if __name__ == "__main__":
    main()
