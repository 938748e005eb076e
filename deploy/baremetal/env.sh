# shellcheck shell=bash
# Shared by the scripts here: the cluster's addresses and the NCCL/InfiniBand settings the
# Kubernetes overlay (deploy/k8s/overlays/r1-2node) sets on its Ray pods. Edit to your site.

# The Ray head: node 1. Workers join it; vLLM runs from it.
RAY_HEAD_IP="${RAY_HEAD_IP:-10.0.0.1}"
RAY_PORT="${RAY_PORT:-6379}"
# DeepSeek-R1 (FP8 weights, 671B): tensor parallel 8 within a node, pipeline parallel 2 across.
MODEL="${MODEL:-deepseek-ai/DeepSeek-R1}"
SERVED_NAME="${SERVED_NAME:-deepseek-r1}"
VLLM_PORT="${VLLM_PORT:-8000}"

# NCCL over InfiniBand between the nodes, NVLink within them.
export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-0}"
export NCCL_IB_HCA="${NCCL_IB_HCA:-mlx5}"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-eth0}"
export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-eth0}"
export NCCL_NET_GDR_LEVEL="${NCCL_NET_GDR_LEVEL:-PHB}"  # GPUDirect RDMA: GPU and NIC share a bridge
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"  # INFO once at bring-up shows the transport NCCL chose
# RoCE only (not native InfiniBand): export NCCL_IB_GID_INDEX=3
# vLLM: FlashMLA for DeepSeek's multi-head latent attention; V1 engine.
export VLLM_ATTENTION_BACKEND="${VLLM_ATTENTION_BACKEND:-FLASHMLA}"
export VLLM_HOST_IP="${VLLM_HOST_IP:-$(hostname -I | awk '{print $1}')}"
