"""Patch sets built on patchreg's public API: ``patches.megatron`` (MTP for PPO, CPU shims), ``patches.vllm``."""
