import warnings

import torch

__all__ = ["BiLSTM"]


class BiLSTM(torch.nn.Module):
    """A bidirectional LSTM as two unidirectional ``torch.nn.LSTM`` (as torch_npu's, which
    Ascend needed because its LSTM lacked ``bidirectional=True``): the forward one runs on
    the sequence, the backward one on the sequence reversed, and their outputs (the
    backward one's re-reversed) are concatenated on the feature axis.

    forward(inputs (seq_len, batch, input_size)) -> (seq_len, batch, 2 * hidden_size).
    Deprecated in torch_npu (a FutureWarning), as there.
    """

    def __init__(self, input_size, hidden_size):
        super().__init__()
        warnings.warn("torch_npu.contrib.BiLSTM is deprecated. "
                      "Please check the documentation for a replacement.", FutureWarning)
        self.fw_rnn = torch.nn.LSTM(input_size, hidden_size, bidirectional=False)
        self.bw_rnn = torch.nn.LSTM(input_size, hidden_size, bidirectional=False)

    def forward(self, inputs):
        if inputs.dim() != 3:
            raise ValueError(f"BiLSTM: expected inputs of shape (seq_len, batch, input_size), got {tuple(inputs.shape)}")
        recurrent_fw, _ = self.fw_rnn(inputs)
        recurrent_bw, _ = self.bw_rnn(torch.flip(inputs, [0]))
        return torch.cat((recurrent_fw, torch.flip(recurrent_bw, [0])), 2)
