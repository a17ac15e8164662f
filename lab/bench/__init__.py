"""Decoding runs measured: the components loaded once (`setup`), each method as a runner
(`methods`), every method on the same prompts interleaved (`run`), the result in words
(`report`), several datasets and temperatures in one resumable file (`endtoend`), and the
decoding commands' options (`options`)."""
from .methods import make_drafter, make_runner
from .options import BenchOptions, DecodeOptions, EndToEndOptions, GenerateOptions
from .report import drafting_line, format_breakdown, format_table, head_file, verification_line
from .run import run_bench, summarise
from .setup import (EAGLE3_METHODS, EAGLE_METHODS, LOSSY_METHODS, METHODS, PEERS, STATIC_METHODS, TIE_GAP, Setup,
                    is_method, load_setup)
