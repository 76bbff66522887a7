"""Hyper-parameter checks shared by the fused optimizers (torch_npu's messages)."""


def check_lr(lr):
    if lr < 0.0:
        raise ValueError("Invalid learning rate: {}".format(lr))


def check_eps(eps):
    if eps < 0.0:
        raise ValueError("Invalid epsilon value: {}".format(eps))


def check_betas(betas):
    if betas[0] < 0.0 or betas[0] >= 1.0:
        raise ValueError("Invalid beta parameter at index 0: {}".format(betas[0]))
    if betas[1] < 0.0 or betas[1] >= 1.0:
        raise ValueError("Invalid beta parameter at index 1: {}".format(betas[1]))


def check_non_negative(name, value):
    if value < 0.0:
        raise ValueError("Invalid {} value: {}".format(name, value))
