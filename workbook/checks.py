"""Every lab's exercise checks, in one place: ``from workbook import checks``.

A check takes the learner's function (or class), runs it — on the simulated cluster where
it is distributed code — and prints one ✅/❌ line (the protocol is in
:mod:`workbook.checking`). Each lesson keeps its checks and its reference answers in its
own package (``workbook.lessonNN``); this module gathers the checks the labs call.
"""

from workbook.lesson02.checks import (check_fp16_allreduce, check_halving_doubling_allreduce,
                                      check_hierarchical_allreduce, check_int8_quantization,
                                      check_local_sgd, check_naive_allreduce,
                                      check_parameter_server, check_ring_allreduce,
                                      check_topk_error_feedback, check_tree_allreduce)
from workbook.lesson03.checks import (check_accumulation, check_allreduce_in_buckets,
                                      check_average_gradients, check_distributed_trainer,
                                      check_overlapped_ddp)
from workbook.lesson04.checks import (check_balance, check_boundary_bytes,
                                      check_forward_backward)
from workbook.lesson05.checks import (check_1f1b, check_gpipe, check_interleaved_bubble,
                                      check_pick_m_v)
from workbook.lesson06.checks import (check_conjugate_operators, check_megatron_mlp,
                                      check_parallel_linears, check_sequence_parallel)
from workbook.lesson07.checks import (check_fit_settings, check_zero1, check_zero2,
                                      check_zero3, check_zero_memory)
from workbook.lesson08.checks import (check_bytes_per_parameter, check_checkpointing,
                                      check_fit, check_loss_scaler)
from workbook.lesson09.checks import (check_build_groups, check_choose_layout,
                                      check_model_flops, check_pipeline_bubble)
from workbook.lesson10.checks import (check_checkpoint_interval, check_find_straggler,
                                      check_recovery, check_resume)
from workbook.lesson11_scheduling.checks import (check_best_fit, check_choose_victims,
                                                 check_easy_backfill, check_topology_placer)

__all__ = ["check_fp16_allreduce", "check_halving_doubling_allreduce",
           "check_hierarchical_allreduce", "check_int8_quantization", "check_local_sgd",
           "check_naive_allreduce", "check_parameter_server", "check_ring_allreduce",
           "check_topk_error_feedback", "check_tree_allreduce",
           "check_accumulation", "check_allreduce_in_buckets", "check_average_gradients",
           "check_distributed_trainer", "check_overlapped_ddp",
           "check_balance", "check_boundary_bytes", "check_forward_backward",
           "check_1f1b", "check_gpipe", "check_interleaved_bubble", "check_pick_m_v",
           "check_conjugate_operators", "check_megatron_mlp", "check_parallel_linears",
           "check_sequence_parallel",
           "check_fit_settings", "check_zero1", "check_zero2", "check_zero3",
           "check_zero_memory",
           "check_bytes_per_parameter", "check_checkpointing", "check_fit",
           "check_loss_scaler",
           "check_build_groups", "check_choose_layout", "check_model_flops",
           "check_pipeline_bubble",
           "check_checkpoint_interval", "check_find_straggler", "check_recovery",
           "check_resume",
           "check_best_fit", "check_choose_victims", "check_easy_backfill",
           "check_topology_placer"]
