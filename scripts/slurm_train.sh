#!/usr/bin/env bash
# SLURM job script: a multi-node yolo-cb run that survives preemption, the time limit and a dead worker.
# Submit with `sbatch scripts/slurm_train.sh`; the recipe and its reasons are in docs/distributed.md.
#SBATCH --job-name=yolo-cb
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one torchrun per node; torchrun starts one worker per GPU
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
#SBATCH --requeue                    # the job may be put back in the queue (by us below, or by preemption)
#SBATCH --signal=B:USR1@180          # 180 s before the time limit: SIGUSR1 to this batch script
#SBATCH --open-mode=append           # a requeued job appends to the same log
#SBATCH --output=%x-%j.log

set -u
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NAME=${NAME:-coco-yolox-s}             # a fixed run name: every start of this job continues the same run folder
PROJECT=${PROJECT:-$PWD/runs/detect}    # rank 0 writes checkpoints here; a shared filesystem keeps them across requeues
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)   # hosts the c10d rendezvous
PORT=${PORT:-29500}
# Multi-homed nodes: name the interface the ranks talk over (see `ip addr`), e.g. InfiniBand or the cluster network.
# export NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

srun --kill-on-bad-exit=0 torchrun \
    --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node="$GPUS_PER_NODE" \
    --rdzv-backend=c10d --rdzv-endpoint="$HEAD:$PORT" --rdzv-id="$SLURM_JOB_ID" \
    --max-restarts=3 \
    -m yolo_cb train data=coco.yaml model=yolox-s.yaml epochs=300 batch=16 \
    project="$PROJECT" name="$NAME" resume=auto save_steps=500 &
PID=$!

STOPPING=0
on_signal() {  # time limit near (USR1) or preemption (TERM): torchrun passes SIGTERM to every worker; they save and exit
    STOPPING=1
    echo "$(date -u +%FT%TZ) $1 received: asking the workers to save last.pt and stop"
    kill -TERM "$PID" 2>/dev/null
}
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM

wait "$PID"
CODE=$?
if [ "$STOPPING" = 1 ]; then
    wait "$PID"  # the first wait was cut short by the signal: wait for the save to finish
    CODE=$?
    echo "$(date -u +%FT%TZ) training stopped (exit $CODE); requeueing job $SLURM_JOB_ID: resume=auto continues from last.pt"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
fi
echo "$(date -u +%FT%TZ) training ended with exit code $CODE"   # 0: finished (a later start only says so)
exit "$CODE"
