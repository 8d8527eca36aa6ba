"""torch_threads narrows torch's intra-op threads for a block and always puts them back."""

from __future__ import annotations

import pytest
import torch

from cl_zoo.threads import torch_threads


def test_threads_are_narrowed_and_restored_even_after_an_error() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), torch_threads(1):
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
        with torch_threads(8):  # never more than torch already has
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
