# fsi_nb for a cloud GPU, on NVIDIA's NGC PyTorch image: CUDA, cuDNN, NCCL and a torch built for them come with the
# image, and the kit installs beside that torch without replacing it. The runbook is nbs/cloud.ipynb.
#   docker build -t fsi_nb:cloud --build-arg NGC_TAG=25.01 .
#   docker run --gpus all -v /mnt/persistent/runs:/workspace/runs fsi_nb:cloud python -m fsi_nb.train --preset h100 ...
ARG NGC_TAG=25.01
FROM nvcr.io/nvidia/pytorch:${NGC_TAG}-py3

# bubblewrap isolates the code a model writes (GRPO's execution rewards, DPO pairs, HumanEval): no network, no host
# files. Without it fsi_nb.sandbox falls back to an unshare-built sandbox, and refuses where neither works. Inside a
# container both need namespaces the container may forbid: `python -m fsi_nb.sandbox` says which mode works and why.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*

WORKDIR /workspace
COPY pyproject.toml README.md /opt/fsi_nb/
COPY fsi_nb /opt/fsi_nb/fsi_nb
# Every dependency but torch from pyproject.toml, then the kit itself with --no-deps: pip never sees a reason to
# fetch a PyPI torch wheel (built for another CUDA) over the image's own.
RUN python -c "import tomllib; deps = tomllib.load(open('/opt/fsi_nb/pyproject.toml', 'rb'))['project']['dependencies']; open('/tmp/requirements.txt', 'w').write(''.join(d + '\n' for d in deps if not d.lower().startswith('torch')))" \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps /opt/fsi_nb \
 && python -c "import torch, fsi_nb.train; print('fsi_nb', fsi_nb.__version__, 'on torch', torch.__version__)"

# Runs and the uploaded corpus live on the persistent volume mounted at /workspace/runs (data in runs/data).
COPY settings.ini /workspace/settings.ini
ENV FSI_NB_SETTINGS=/workspace/settings.ini TOKENIZERS_PARALLELISM=false
# The TensorBoard mirror follows every run when settings.ini says tensorboard = true (it exits at once otherwise).
ENTRYPOINT ["/bin/sh", "-c", "python -m fsi_nb.tb --follow --interval 30 & exec \"$@\"", "--"]
CMD ["python", "-m", "fsi_nb.train", "--help"]
