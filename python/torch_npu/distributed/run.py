"""torch_npu.distributed.run: torchrun's launcher with torch_npu's extra option.

``parse_args(args)`` is torchrun's argument parser plus ``--enable_tiered_parallel_tcpstore``
(env ``PET_ENABLE_TIERED_PARALLEL_TCPSTORE``, default "false"); ``python -m
torch_npu.distributed.run ...`` launches as torchrun does. torch_npu's own ``parallel``
rendezvous backend (a tiered TCPStore proxy on real clusters) is not part of this
torch_npu, so the rendezvous is the one the arguments choose (torchrun's default, static/c10d).
"""
__all__ = ["parse_args"]


def parse_args(args):
    from torch.distributed.argparse_util import env
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.add_argument(
        "--enable_tiered_parallel_tcpstore",
        action=env,
        type=str,
        default="false",
        help="Turn parallel tcpstore tiered optimization, if true, The agent adds a proxy role,"
        "the worker on this node will connect to the server through the proxy.",
    )
    return parser.parse_args(args)


def _main(args=None):
    from torch.distributed import run as torch_run
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        torch_run.run(parse_args(args))

    main()


if __name__ == "__main__":
    _main()
