"""The registry of downloadable datasets: published URL, cache path and sha256 of every file.

Each checksum says how it was obtained (`verified`):
- "git": the sha256 of the file's blob in the publisher's repository at the pinned commit of the URL;
- "git+copy": as "git", and equal to an independently obtained copy of the same file;
- "pinned on first download": the publisher hosts the file outside git (a release asset or a
  blob store) and publishes no checksum; the first download records the file's sha256 in the
  cache and every later use is checked against that record.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

GIT, GIT_COPY, FIRST_DOWNLOAD = "git", "git+copy", "pinned on first download"

AZURE_2023 = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/790921015d50dd6aae7f7e47f39ba0e235ad6b08/data"
AZURE_2024 = "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace"
BURSTGPT = "https://github.com/HPMLL/BurstGPT/releases/download/v1.1"
MOONCAKE = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28"
            "/FAST25-release/traces")
VIDUR = "https://raw.githubusercontent.com/microsoft/vidur/7d47513363ec447a741ac5e47241580b47724fbf/data/profiling"


@dataclass(frozen=True)
class RemoteFile:
    url: str
    path: str                    # relative to the cache root; also the path under a --mirror URL
    sha256: Optional[str]        # None: no published checksum (pinned on first download)
    verified: str


@dataclass(frozen=True)
class Dataset:
    name: str
    kind: str                    # "trace" | "profile"
    description: str
    files: tuple
    source: str                  # who publishes it, under which licence

    @property
    def local(self) -> str:
        """What a run reads, relative to the cache root: the trace file, or the profile directory."""
        first = self.files[0].path
        return first if self.kind == "trace" else first.rsplit("/", 1)[0]


def _trace(name, description, base, filename, sha256, verified, source) -> Dataset:
    return Dataset(name, "trace", description,
                   (RemoteFile(f"{base}/{filename}", f"traces/{name}/{filename}", sha256, verified),), source)


_AZURE_SRC = "Azure/AzurePublicDataset (CC-BY 4.0)"
TRACES = {d.name: d for d in (
    _trace("azure_code", "Azure LLM inference 2023, code: 8,819 requests over ~1 hour", AZURE_2023,
           "AzureLLMInferenceTrace_code.csv", "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
           GIT_COPY, _AZURE_SRC),
    _trace("azure_conv", "Azure LLM inference 2023, conversation: 19,366 requests over ~1 hour", AZURE_2023,
           "AzureLLMInferenceTrace_conv.csv", "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
           GIT, _AZURE_SRC),
    _trace("azure_code_week", "Azure LLM inference 2024, code: one week (May 2024)", AZURE_2024,
           "AzureLLMInferenceTrace_code_1week.csv", None, FIRST_DOWNLOAD, _AZURE_SRC),
    _trace("azure_conv_week", "Azure LLM inference 2024, conversation: one week (May 2024)", AZURE_2024,
           "AzureLLMInferenceTrace_conv_1week.csv", None, FIRST_DOWNLOAD, _AZURE_SRC),
    _trace("burstgpt", "BurstGPT: ChatGPT and GPT-4 requests over the first 2 months (with failures)",
           BURSTGPT, "BurstGPT_1.csv", None, FIRST_DOWNLOAD, "HPMLL/BurstGPT (CC-BY 4.0)"),
    _trace("mooncake_conversation", "Mooncake (Kimi) conversation trace: 12,031 requests, prefix hash ids", MOONCAKE,
           "conversation_trace.jsonl", "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
           GIT, "kvcache-ai/Mooncake (Apache-2.0)"),
    _trace("mooncake_synthetic", "Mooncake synthetic trace: 3,993 requests, long shared prefixes", MOONCAKE,
           "synthetic_trace.jsonl", "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
           GIT_COPY, "kvcache-ai/Mooncake (Apache-2.0)"),
    _trace("mooncake_toolagent", "Mooncake (Kimi) tool-and-agent trace, with prefix hash ids", MOONCAKE,
           "toolagent_trace.jsonl", None, FIRST_DOWNLOAD, "kvcache-ai/Mooncake (Apache-2.0)"),
)}

# Vidur's published profiles (data/profiling at the pinned commit), each file's git-blob sha256.
# Attention tables (attention.csv) are not listed: their blobs were not available to check.
_VIDUR_FILES = (
    ("compute/a100/Qwen/Qwen-72B/mlp.csv", "81a4a7b16a99e256f1f47cc25c3d098ecf4ff7ab2260e921759dd7c06e93cce9"),
    ("compute/a100/codellama/CodeLlama-34b-Instruct-hf/mlp.csv",
     "9ba6058c55b7c291ccdf9cd445655de93d3a3dfc0fdd8b08f654170413906dce"),
    ("compute/a100/internlm/internlm-20b/mlp.csv", "efdad580da6ecb50e3716543439a31fc71484de365e0f8cfe9430c5e4d5487c3"),
    ("compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv",
     "d690ce601f94ab80586e1d5a6a92ea0d64114dc3e0895bf32b3bee270f3d9b7f"),
    ("compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
     "2cfacca979f32e83257753cf6fd815a71af8ba9a7a9d0643b18d9f54e8a37688"),
    ("compute/a100/meta-llama/Meta-Llama-3-70B/mlp.csv",
     "6929c6f4afae67f7d91a7938ebdb350a47923b077a1b1c2a4e1911f5ec9e601f"),
    ("compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
     "98c26488298e324e89db7349e213f75c856ae83dc6b17548a68636d2cb5efff0"),
    ("compute/a100/microsoft/phi-2/mlp.csv", "98a16c552786c8dd3d935d1d8c06434d0ae7c628b9c23ac26fbde551b272bde6"),
    ("compute/a40/Qwen/Qwen-72B/mlp.csv", "103db51fecb0bdbb5be21b8274706d5700d0d68f3b6b63cd68967b12d839426f"),
    ("compute/a40/codellama/CodeLlama-34b-Instruct-hf/mlp.csv",
     "0e9b6468d8fb2d25c55c5d142b5314bb6ae56b6b2991f2de555cb8857389f480"),
    ("compute/a40/internlm/internlm-20b/mlp.csv", "754c48913b65eff1f7db9c8e4dcc45f92b27cccfd59e0309d617a3f07536d0fa"),
    ("compute/a40/meta-llama/Llama-2-70b-hf/mlp.csv",
     "a666d9463c0f6994f8103175cad6359bd738e6d4f8e66e56f1dcf88482f91485"),
    ("compute/a40/meta-llama/Llama-2-7b-hf/mlp.csv",
     "f8d0f455d0b72b7975be0ed8e1951dcbf2eabc083001b27f6ef8203c0a96962c"),
    ("compute/a40/microsoft/phi-2/mlp.csv", "a5708bd10ef825617c4cc82ce624a467a5aa87092765be41b1dcde72fb3248eb"),
    ("compute/h100/Qwen/Qwen-72B/mlp.csv", "8056ad93e8dec592de1cc253edb228d1c475646d98db0d113f96b4693f91bb22"),
    ("compute/h100/codellama/CodeLlama-34b-Instruct-hf/mlp.csv",
     "f5ddfd2ab5a8342c34866f53214a4a4f8f535369c29159da0be2d524bcaf00a5"),
    ("compute/h100/internlm/internlm-20b/mlp.csv", "8d2d37e685652600a4dfc2d91be74a1f197c01f0b41c532443479507446039aa"),
    ("compute/h100/meta-llama/Llama-2-70b-hf/mlp.csv",
     "fb3581ade7c02caab8a0f7d1ca1ad06a7b0fbac3d9f32a9ed46ae55d95fd6bb3"),
    ("compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
     "b1a2def08857d10e5f66c3b5b2d046b6e8caed5c30b2bc920a0462598e3b2a59"),
    ("compute/h100/microsoft/phi-2/mlp.csv", "dfbf4965acfdd01a5f32f8326873df299a226e95bdd496dac99e766f952430fc"),
    ("network/a100_dgx/all_reduce.csv", "5ea3f3c229fee1ef70ea308881fff420d60ab6f30e86edda1ed6146b12eb28ef"),
    ("network/a100_dgx/send_recv.csv", "7e5968cf616af8208a1420816c4ffba9ee857cd989148ae54ebf46239e477a72"),
    ("network/a100_pairwise_nvlink/all_reduce.csv", "27428d884ae095800e81366c7517af93fd7476633cfe5e55bdd155e004485dab"),
    ("network/a100_pairwise_nvlink/send_recv.csv", "b962137cf047ab0bb80d11f45ea2a008b9684d0749805995b44b112ae302fff4"),
    ("network/a40_pairwise_nvlink/send_recv.csv", "35fa1923766235c3ffa9d48213af0d436f971d7b856e1e180fe8ddd37730d128"),
    ("network/h100_dgx/all_reduce.csv", "7bc107da2ca2790ab5aa6585eba71603bf7359dd7e7cba1b586f885cae8bcb81"),
    ("network/h100_dgx/send_recv.csv", "605b758cd4791cbbd1fab8d5d990463b237346e9365823d768299368fc50c4c9"),
    ("network/h100_pairwise_nvlink/all_reduce.csv", "8d68ee6979682726cd7c1d06b8a3656dea5bf53d074d62b3e080ed306b03c155"),
    ("network/h100_pairwise_nvlink/send_recv.csv", "b962137cf047ab0bb80d11f45ea2a008b9684d0749805995b44b112ae302fff4"),
)
# checked against a second copy as well as the git blob
_VIDUR_COPIED = {"compute/a100/meta-llama/Meta-Llama-3-8B", "network/a100_dgx", "network/h100_dgx"}


def _profiles() -> dict:
    """One profile per directory: `a100/meta-llama/Meta-Llama-3-8B` (compute), `network/h100_dgx`."""
    groups: dict = {}
    for rel, sha in _VIDUR_FILES:
        folder = rel.rsplit("/", 1)[0]
        groups.setdefault(folder, []).append(
            RemoteFile(f"{VIDUR}/{rel}", f"profiles/vidur/{rel}", sha,
                       GIT_COPY if folder in _VIDUR_COPIED else GIT))
    out = {}
    for folder, files in groups.items():
        name = folder.removeprefix("compute/")
        what = "GPU kernel times per op (mlp.csv)" if folder.startswith("compute/") else \
            "collective and point-to-point transfer times"
        out[name] = Dataset(name, "profile", f"Vidur profile {name}: {what}", tuple(files),
                            "microsoft/vidur (MIT)")
    return out


PROFILES = _profiles()
CATALOGS = {"trace": TRACES, "profile": PROFILES}
