"""The machinery around the handout's code: what makes it fast, robust and portable.

The handout's files (run.py, dataset.py, model.py, attention.py, trainer.py, utils.py)
call these modules or hand them their objects; nothing here is a part a student writes,
and a student never needs to open this folder. Each module says what it is for:
packing and dropout (a fast CPU training step), decoding (fast greedy answers), devices
and cpu_libraries (where and in what precision to run), distributed (torchrun), resume
and metrics (resumable runs and their logs), checks, files and params_files (bad input
refused before any work), run_cards (what each params file was made with, beside it),
course_data (the data files fetched and checked),
finetune_methods (LoRA and adapters), shared_runs (several pretrainings of one variant
stepping together in one process).
"""
