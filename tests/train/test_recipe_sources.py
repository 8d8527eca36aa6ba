"""Each CIFAR-10 recipe value is pinned to the source line its comment quotes.

The table below is the review record of issue 39: for every key of every ``recipes/*cifar10*.yaml`` it holds
the value, where it comes from and (when the source has one) the exact text quoted. A silent edit of a value,
a comment that no longer quotes its source, or a new key without a source fails here.

Where-prefixes (the recipes' headers say the same):

* ``LB:<line>``: lightly-ai/lightly, tag v1.5.26 (e7c81fa1), docs/source/getting_started/benchmarks/cifar10_benchmark.py
  (its DCL, DCLW, SimCLRModel and MocoModel classes are identical at 42a6a924, the commit its results docstring
  names, and at e8d317fc); ``lightly/<file>:<line>``: lightly's package source at the same tag;
* ``JCL:``, ``EqCo:``, ``CMC:``, ``CACR:<line>``: the papers' text in ../shared/seeds/ (000, 003, 002, 004);
* ``cl-zoo ...``, ``provenance``, ``unused with cosine``: cl-zoo's own settings, not copied from anywhere.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from cl_zoo.methods import build_method_from_recipe
from cl_zoo.train.recipe import RECIPES_DIR, Recipe

SOURCES: dict[str, dict[str, tuple[Any, str, str | None]]] = {'cacr_cifar10': {'arch': ('resnet18_cifar', 'LB:364', 'resnet-18'),
                  'method_args.num_positives': (4, 'CACR:1628', 'the positive sampling size is K= 4'),
                  'method_args.t_pos': (1.0, 'CACR:1630', 'we set t+= 1.0for all small-scale datasets'),
                  'method_args.t_neg': (0.9,
                                        'CACR:1632',
                                        'For CACR ( K= 4),t−is 0.9, 2.0, and 2.0 on CIFAR-10, CIFAR100, and STL-10'),
                  'method_args.form': ('in_batch', 'CACR:1550', 'all experiments are conducted on a single GPU'),
                  'method_args.head_hidden_dim': (512, 'LB:368', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                  'method_args.head_out_dim': (128, 'LB:368', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                  'method_args.head_layers': (2, 'lightly/models/modules/heads.py:281', 'num_layers: int = 2,'),
                  'method_args.head_bn': (True, 'lightly/models/modules/heads.py:282', 'batch_norm: bool = True,'),
                  'data.image_size': (32, 'CACR:1565', 'transforms.RandomResizedCrop(32, scale=(0.2, 1)),'),
                  'data.augment': ('align_uniform', 'CACR:1565-1572', 'transforms.ColorJitter(0.4, 0.4, 0.4, 0.4),'),
                  'data.dataset': ('cifar10', 'provenance', None),
                  'optim.name': ('sgd', 'CACR:1620', 'We apply the mini-batch SGD with 0.9 momentum and 1e-4 weight decay.'),
                  'optim.lr': (0.12, 'CACR:1621', 'The learning rate is linearly scaled as 0.12 per 256 batch size'),
                  'optim.lr_scaling': ('linear', 'CACR:1621', 'linearly scaled ... (Goyal et al., 2017)'),
                  'optim.base_batch': (256, 'CACR:1621', '0.12 per 256 batch size'),
                  'optim.momentum': (0.9, 'CACR:1620', 'SGD with 0.9 momentum'),
                  'optim.weight_decay': (0.0001, 'CACR:1620', 'and 1e-4 weight decay'),
                  'optim.nesterov': (False, 'CACR:1620', 'mini-batch SGD'),
                  'schedule.name': ('step',
                                    'CACR:1622',
                                    'the learning rate is decayed by a factor of 0.1 at epoch 155, 170, and 185'),
                  'schedule.warmup_epochs': (0, 'CACR:1620-1622', None),
                  'schedule.milestones': ([155, 170, 185], 'CACR:1622', 'at epoch 155, 170, and 185'),
                  'schedule.gamma': (0.1, 'CACR:1622', 'decayed by a factor of 0.1'),
                  'epochs': (200, 'CACR:1622', 'The optimization is done over 200 epochs'),
                  'batch_size': (128, 'CACR:1629', 'the training batch size is set as M= 128'),
                  'precision': ('auto', 'cl-zoo default', None),
                  'sync_bn': (False, 'CACR:1550', 'on a single GPU'),
                  'knn_every': (10, 'cl-zoo online kNN monitor', None)},
 'cmc_cifar10': {'arch': ('resnet18_cifar', 'LB:364', 'resnet-18'),
                 'method_args.num_views': (5,
                                           'CACR:1627-1628',
                                           'For CMC and CACR with multiple positives, the positive sampling size is K= 4'),
                 'method_args.graph': ('full', 'CACR:1696', 'the loss is calculated with Equation (8) in the paper'),
                 'method_args.temperature': (0.07,
                                             'CACR:1695',
                                             'CMC (K= 4), the temperature is set τ= 0.07according to the setting in Tian et al. '
                                             '(2019)'),
                 'method_args.negatives': ('in_batch', 'CACR:422', 'use augmentation views instead of channels'),
                 'method_args.head_hidden_dim': (512, 'LB:368', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                 'method_args.head_out_dim': (128, 'LB:368', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                 'method_args.head_layers': (2, 'lightly/models/modules/heads.py:281', 'num_layers: int = 2,'),
                 'method_args.head_bn': (True, 'lightly/models/modules/heads.py:282', 'batch_norm: bool = True,'),
                 'data.image_size': (32, 'CACR:1565', 'transforms.RandomResizedCrop(32, scale=(0.2, 1)),'),
                 'data.augment': ('align_uniform', 'CACR:422', 'align with our augmentation settings'),
                 'data.dataset': ('cifar10', 'provenance', None),
                 'optim.name': ('sgd', 'CACR:1620', 'We apply the mini-batch SGD with 0.9 momentum and 1e-4 weight decay.'),
                 'optim.lr': (0.12, 'CACR:1621', 'The learning rate is linearly scaled as 0.12 per 256 batch size'),
                 'optim.lr_scaling': ('linear', 'CACR:1621', 'linearly scaled ... (Goyal et al., 2017)'),
                 'optim.base_batch': (256, 'CACR:1621', '0.12 per 256 batch size'),
                 'optim.momentum': (0.9, 'CACR:1620', 'SGD with 0.9 momentum'),
                 'optim.weight_decay': (0.0001, 'CACR:1620', 'and 1e-4 weight decay'),
                 'optim.nesterov': (False, 'CACR:1620', 'mini-batch SGD'),
                 'schedule.name': ('step',
                                   'CACR:1622',
                                   'the learning rate is decayed by a factor of 0.1 at epoch 155, 170, and 185'),
                 'schedule.warmup_epochs': (0, 'CACR:1620-1622', None),
                 'schedule.milestones': ([155, 170, 185], 'CACR:1622', 'at epoch 155, 170, and 185'),
                 'schedule.gamma': (0.1, 'CACR:1622', 'decayed by a factor of 0.1'),
                 'epochs': (200, 'CACR:1622', 'The optimization is done over 200 epochs'),
                 'batch_size': (128, 'CACR:1629', 'the training batch size is set as M= 128'),
                 'precision': ('auto', 'cl-zoo default', None),
                 'sync_bn': (False, 'CACR:1550', 'on a single GPU'),
                 'knn_every': (10, 'cl-zoo online kNN monitor', None)},
 'cmc_cifar10_lab': {'arch': ('cmc_resnet18_cifar_lab', 'cl-zoo', 'ResNet-50 L+ab'),
                     'method_args.temperature': (0.07, 'CMC:156', 'we set the temperature τ as 0.07'),
                     'method_args.negatives': ('memory_bank',
                                               'CMC:501',
                                               'For the memory-based CMC model, we adopt ideas from [79] for computing and '
                                               'storing a memory'),
                     'method_args.objective': ('softmax',
                                               'CMC:135',
                                               'randomly sample m negatives and do a simple (m+1)-way softmax classification'),
                     'method_args.num_negatives': (4096, 'CMC:501', 'We retrieve 4096 negative pairs from the memory bank'),
                     'method_args.bank_size': (50000, 'one memory entry per training image', None),
                     'method_args.bank_momentum': (0.5, 'CMC:156', 'use a momentum 0.5 for memory update'),
                     'method_args.head_hidden_dim': (None, "CMC's code", None),
                     'method_args.head_out_dim': (128, "CMC's code", None),
                     'method_args.head_layers': (1, "CMC's code", None),
                     'method_args.head_bn': (False, "CMC's code", None),
                     'data.image_size': (32, 'CIFAR-10 native resolution', None),
                     'data.augment': ('cmc', 'CMC:156', 'we use Py-Torch [59] default data augmentation'),
                     'data.dataset': ('cifar10', 'provenance', None),
                     'optim.name': ('sgd', 'CMC:581', 'we use SGD to train the network for a total of 200 epochs'),
                     'optim.lr': (0.03, 'CMC:581', 'The learning rate is initialized as 0.03'),
                     'optim.lr_scaling': ('linear', 'cl-zoo', None),
                     'optim.base_batch': (256, "CMC's code default batch", None),
                     'optim.momentum': (0.9, 'CMC:581', 'momentum is kept as 0.9'),
                     'optim.weight_decay': (0.0001, 'CMC:581', 'Weight decay is set as 10^{-4}'),
                     'optim.nesterov': (False, 'CMC:581', None),
                     'schedule.name': ('cosine',
                                       'CMC:583',
                                       'For ResNets in CMC stage, instead of using step decay, we choose cosine annealing'),
                     'schedule.warmup_epochs': (0, 'CMC:581-583', None),
                     'schedule.milestones': ([], 'unused with cosine', None),
                     'schedule.gamma': (0.1, 'unused with cosine', None),
                     'epochs': (200, 'CMC:581', 'a total of 200 epochs'),
                     'batch_size': (256, "CMC's code default batch", None),
                     'precision': ('auto', 'cl-zoo default', None),
                     'sync_bn': (False, 'single GPU', None),
                     'knn_every': (10, 'cl-zoo online kNN monitor', None)},
 'dcl_cifar10': {'arch': ('resnet18_cifar', 'LB:760', 'resnet-18'),
                 'method_args.temperature': (0.1, 'LB:765', 'self.criterion = DCLLoss()'),
                 'method_args.head_hidden_dim': (512, 'LB:764', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                 'method_args.head_out_dim': (128, 'LB:764', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                 'method_args.head_layers': (2, 'lightly/models/modules/heads.py:281', 'num_layers: int = 2,'),
                 'method_args.head_bn': (True, 'lightly/models/modules/heads.py:282', 'batch_norm: bool = True,'),
                 'method_args.no_decay_norm_bias': (False,
                                                    'LB:782',
                                                    'self.parameters(), lr=6e-2 * lr_factor, momentum=0.9, weight_decay=5e-4'),
                 'data.image_size': (32, 'LB:175', 'input_size=32,'),
                 'data.augment': ('cifar', 'LB:174-177', 'SimCLRTransform(input_size=32, cj_strength=0.5, gaussian_blur=0.0)'),
                 'data.dataset': ('cifar10', 'provenance', None),
                 'optim.name': ('sgd', 'LB:782', 'torch.optim.SGD('),
                 'optim.lr': (0.06, 'LB:782', 'lr=6e-2 * lr_factor'),
                 'optim.lr_scaling': ('linear',
                                      'LB:126',
                                      'lr_factor = batch_size / 128  # scales the learning rate linearly with batch size'),
                 'optim.base_batch': (128, 'LB:126', 'lr_factor = batch_size / 128'),
                 'optim.momentum': (0.9, 'LB:782', 'momentum=0.9'),
                 'optim.weight_decay': (0.0005, 'LB:782', 'weight_decay=5e-4'),
                 'optim.nesterov': (False, 'LB:782', None),
                 'schedule.name': ('cosine', 'LB:784', 'torch.optim.lr_scheduler.CosineAnnealingLR(optim, max_epochs)'),
                 'schedule.warmup_epochs': (0, 'LB:784', None),
                 'schedule.milestones': ([], 'unused with cosine', None),
                 'schedule.gamma': (0.1, 'unused with cosine', None),
                 'epochs': (200, 'LB:103', 'max_epochs = 200'),
                 'batch_size': (512, 'LB:24', '| DCL | 512 | 200 | 0.840 |'),
                 'precision': ('auto', 'cl-zoo default', None),
                 'sync_bn': (False, 'LB:115', 'sync_batchnorm = False'),
                 'knn_every': (10, 'cl-zoo online kNN monitor', 'knn_k = 200')},
 'dclw_cifar10': {'arch': ('resnet18_cifar', 'LB:792', 'resnet-18'),
                  'method_args.temperature': (0.1, 'LB:797', 'self.criterion = DCLWLoss()'),
                  'method_args.sigma': (0.5, 'LB:797', 'DCLWLoss()'),
                  'method_args.head_hidden_dim': (512, 'LB:796', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                  'method_args.head_out_dim': (128, 'LB:796', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                  'method_args.head_layers': (2, 'lightly/models/modules/heads.py:281', 'num_layers: int = 2,'),
                  'method_args.head_bn': (True, 'lightly/models/modules/heads.py:282', 'batch_norm: bool = True,'),
                  'method_args.no_decay_norm_bias': (False,
                                                     'LB:814',
                                                     'self.parameters(), lr=6e-2 * lr_factor, momentum=0.9, weight_decay=5e-4'),
                  'data.image_size': (32, 'LB:175', 'input_size=32,'),
                  'data.augment': ('cifar', 'LB:174-177', 'SimCLRTransform(input_size=32, cj_strength=0.5, gaussian_blur=0.0)'),
                  'data.dataset': ('cifar10', 'provenance', None),
                  'optim.name': ('sgd', 'LB:814', 'torch.optim.SGD('),
                  'optim.lr': (0.06, 'LB:814', 'lr=6e-2 * lr_factor'),
                  'optim.lr_scaling': ('linear',
                                       'LB:126',
                                       'lr_factor = batch_size / 128  # scales the learning rate linearly with batch size'),
                  'optim.base_batch': (128, 'LB:126', 'lr_factor = batch_size / 128'),
                  'optim.momentum': (0.9, 'LB:814', 'momentum=0.9'),
                  'optim.weight_decay': (0.0005, 'LB:814', 'weight_decay=5e-4'),
                  'optim.nesterov': (False, 'LB:814', None),
                  'schedule.name': ('cosine', 'LB:816', 'torch.optim.lr_scheduler.CosineAnnealingLR(optim, max_epochs)'),
                  'schedule.warmup_epochs': (0, 'LB:816', None),
                  'schedule.milestones': ([], 'unused with cosine', None),
                  'schedule.gamma': (0.1, 'unused with cosine', None),
                  'epochs': (200, 'LB:103', 'max_epochs = 200'),
                  'batch_size': (512, 'LB:25', '| DCLW | 512 | 200 | 0.824 |'),
                  'precision': ('auto', 'cl-zoo default', None),
                  'sync_bn': (False, 'LB:115', 'sync_batchnorm = False'),
                  'knn_every': (10, 'cl-zoo online kNN monitor', 'knn_k = 200')},
 'jcl_cifar10': {'arch': ('resnet18_cifar', 'JCL:314', 'we adopt ResNet-18 as the backbone'),
                 'method_args.temperature': (0.2, 'JCL:143', 'softmax temperature $\\tau=0.2$'),
                 'method_args.lam': (4.0, 'JCL:143', 'and $\\lambda=4.0$ in Eq.(8)'),
                 'method_args.lambda_ramp': (False, 'JCL:120', None),
                 'method_args.num_keys': (5, 'JCL:143', "we use positive key number M'=5"),
                 'method_args.queue_size': (4096, 'LB:313', 'memory_bank_size=4096,'),
                 'method_args.momentum': (0.99, 'LB:324', 'update_momentum(self.backbone, self.backbone_momentum, 0.99)'),
                 'method_args.head_hidden_dim': (512, 'LB:304', 'heads.MoCoProjectionHead(512, 512, 128)'),
                 'method_args.head_out_dim': (128, 'JCL:143', 'The dimension of this embedding is d=128'),
                 'method_args.head_layers': (2, 'JCL:143', 'We attach a two-layer MLP'),
                 'method_args.head_bn': (False, 'JCL:143', 'strictly follow the implementations in MoCo v2'),
                 'data.image_size': (32, 'CIFAR-10 native resolution', 'input_size=32,'),
                 'data.augment': ('cifar', 'LB:174-177', 'SimCLRTransform(input_size=32, cj_strength=0.5, gaussian_blur=0.0)'),
                 'data.dataset': ('cifar10', 'provenance', None),
                 'optim.name': ('sgd', 'JCL:306', 'For pre-training, we use SGD with 0.9 momentum and 0.0001 weight decay.'),
                 'optim.lr': (0.1, 'JCL:314', 'The learning rate is set to lr=0.1'),
                 'optim.lr_scaling': ('linear', 'linear scaling from the ablation batch', None),
                 'optim.base_batch': (128, 'JCL:314', 'with a batch size of N=128'),
                 'optim.momentum': (0.9, 'JCL:306', 'SGD with 0.9 momentum'),
                 'optim.weight_decay': (0.0001, 'JCL:306', 'and 0.0001 weight decay'),
                 'optim.nesterov': (False, 'JCL:143', None),
                 'schedule.name': ('cosine', 'JCL:314', 'gradually annealed following a cosine decay schedule'),
                 'schedule.warmup_epochs': (10, 'NOT from a source', None),
                 'schedule.milestones': ([], 'unused with cosine', None),
                 'schedule.gamma': (0.1, 'unused with cosine', None),
                 'epochs': (200, 'JCL:143', 'We train JCL for 200 epochs'),
                 'batch_size': (256, 'cl-zoo', 'N=128'),
                 'precision': ('auto', 'cl-zoo default', None),
                 'sync_bn': (False, 'LB:115', 'sync_batchnorm = False'),
                 'knn_every': (10, 'cl-zoo online kNN monitor', None)},
 'mocov2_cifar10': {'arch': ('resnet18_cifar', 'LB:298', 'resnet-18'),
                    'method_args.temperature': (0.1, 'LB:312', 'temperature=0.1,'),
                    'method_args.queue_size': (8192, 'LB:49', '(*): Increased size of memory bank from 4096 to 8192'),
                    'method_args.momentum': (0.99,
                                             'LB:324',
                                             'utils.update_momentum(self.backbone, self.backbone_momentum, 0.99)'),
                    'method_args.head_hidden_dim': (512, 'LB:304', 'heads.MoCoProjectionHead(512, 512, 128)'),
                    'method_args.head_out_dim': (128, 'LB:304', 'heads.MoCoProjectionHead(512, 512, 128)'),
                    'method_args.head_layers': (2, 'lightly/models/modules/heads.py:163', 'num_layers: int = 2,'),
                    'method_args.head_bn': (False, 'lightly/models/modules/heads.py:164', 'batch_norm: bool = False,'),
                    'method_args.symmetric': (True, 'LB:342', 'loss = 0.5 * (loss_1 + loss_2)'),
                    'method_args.split_bn': (8, 'LB:297', 'num_splits = 0 if sync_batchnorm else 8'),
                    'method_args.no_decay_norm_bias': (False,
                                                       'LB:347-354',
                                                       'params = list(self.backbone.parameters()) + '
                                                       'list(self.projection_head.parameters())'),
                    'data.image_size': (32, 'LB:175', 'input_size=32,'),
                    'data.augment': ('cifar', 'LB:248', 'MocoModel: simclr_transform,'),
                    'data.dataset': ('cifar10', 'provenance', None),
                    'optim.name': ('sgd', 'LB:350', 'optim = torch.optim.SGD('),
                    'optim.lr': (0.06, 'LB:352', 'lr=6e-2 * lr_factor,'),
                    'optim.lr_scaling': ('linear',
                                         'LB:126',
                                         'lr_factor = batch_size / 128  # scales the learning rate linearly with batch size'),
                    'optim.base_batch': (128, 'LB:126', 'lr_factor = batch_size / 128'),
                    'optim.momentum': (0.9, 'LB:353', 'momentum=0.9,'),
                    'optim.weight_decay': (0.0005, 'LB:354', 'weight_decay=5e-4,'),
                    'optim.nesterov': (False, 'LB:350', None),
                    'schedule.name': ('cosine', 'LB:356', 'torch.optim.lr_scheduler.CosineAnnealingLR(optim, max_epochs)'),
                    'schedule.warmup_epochs': (0, 'LB:356', None),
                    'schedule.milestones': ([], 'unused with cosine', None),
                    'schedule.gamma': (0.1, 'unused with cosine', None),
                    'epochs': (200, 'LB:103', 'max_epochs = 200'),
                    'batch_size': (512, 'LB:28', '| Moco (*) | 512 | 200 | 0.847 |'),
                    'precision': ('auto', 'cl-zoo default', None),
                    'sync_bn': (False, 'LB:115', 'sync_batchnorm = False'),
                    'knn_every': (10, 'cl-zoo online kNN monitor', 'knn_k = 200')},
 'simclr_cifar10': {'arch': ('resnet18_cifar', 'LB:364', 'resnet-18'),
                    'method_args.temperature': (0.5, 'LB:369', 'self.criterion = NTXentLoss()'),
                    'method_args.head_hidden_dim': (512, 'LB:368', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                    'method_args.head_out_dim': (128, 'LB:368', 'heads.SimCLRProjectionHead(512, 512, 128)'),
                    'method_args.head_layers': (2, 'lightly/models/modules/heads.py:281', 'num_layers: int = 2,'),
                    'method_args.head_bn': (True, 'lightly/models/modules/heads.py:282', 'batch_norm: bool = True,'),
                    'method_args.no_decay_norm_bias': (False,
                                                       'LB:386',
                                                       'self.parameters(), lr=6e-2 * lr_factor, momentum=0.9, weight_decay=5e-4'),
                    'data.image_size': (32, 'LB:175', 'input_size=32,'),
                    'data.augment': ('cifar', 'LB:174-177', 'SimCLRTransform(input_size=32, cj_strength=0.5, gaussian_blur=0.0)'),
                    'data.dataset': ('cifar10', 'provenance', None),
                    'optim.name': ('sgd', 'LB:386', 'torch.optim.SGD('),
                    'optim.lr': (0.06, 'LB:386', 'lr=6e-2 * lr_factor'),
                    'optim.lr_scaling': ('linear',
                                         'LB:126',
                                         'lr_factor = batch_size / 128  # scales the learning rate linearly with batch size'),
                    'optim.base_batch': (128, 'LB:126', 'lr_factor = batch_size / 128'),
                    'optim.momentum': (0.9, 'LB:386', 'momentum=0.9'),
                    'optim.weight_decay': (0.0005, 'LB:386', 'weight_decay=5e-4'),
                    'optim.nesterov': (False, 'LB:386', None),
                    'schedule.name': ('cosine', 'LB:388', 'torch.optim.lr_scheduler.CosineAnnealingLR(optim, max_epochs)'),
                    'schedule.warmup_epochs': (0, 'LB:388', None),
                    'schedule.milestones': ([], 'unused with cosine', None),
                    'schedule.gamma': (0.1, 'unused with cosine', None),
                    'epochs': (200, 'LB:103', 'max_epochs = 200'),
                    'batch_size': (512, 'LB:30', '| SimCLR | 512 | 200 | 0.848 |'),
                    'precision': ('auto', 'cl-zoo default', None),
                    'sync_bn': (False, 'LB:115', 'sync_batchnorm = False'),
                    'knn_every': (10, 'cl-zoo online kNN monitor', 'knn_k = 200')},
 'simo_cifar10': {'arch': ('resnet18_cifar', 'LB:298', 'resnet-18'),
                  'method_args.temperature': (0.2, 'EqCo:172', "exactly the same as MoCo v2's"),
                  'method_args.alpha': (256, 'EqCo:188', 'SiMo ($K = 256, \\alpha = 256$) 200 68.0'),
                  'method_args.num_negatives': (256, 'EqCo:188', 'SiMo ($K = 256, \\alpha = 256$)'),
                  'method_args.momentum': (0.99, 'LB:324', 'update_momentum(self.backbone, self.backbone_momentum, 0.99)'),
                  'method_args.head_hidden_dim': (512, 'LB:304', 'heads.MoCoProjectionHead(512, 512, 128)'),
                  'method_args.head_out_dim': (128, 'EqCo:144', '128-d features are employed for *query* and *key* embeddings'),
                  'method_args.head_layers': (2, 'EqCo:172', None),
                  'method_args.head_bn': (True, 'EqCo:172', 'we use a BN attached to each of the fully-connected layers'),
                  'method_args.symmetric': (False, "authors' code", None),
                  'data.image_size': (32, 'LB:175', 'input_size=32,'),
                  'data.augment': ('cifar', 'LB:248', 'MocoModel: simclr_transform,'),
                  'data.dataset': ('cifar10', 'provenance', None),
                  'optim.name': ('sgd', 'LB:350', 'optim = torch.optim.SGD('),
                  'optim.lr': (0.06, 'LB:352', 'lr=6e-2 * lr_factor,'),
                  'optim.lr_scaling': ('linear',
                                       'EqCo:136',
                                       'the learning rate should be adjusted proportional to the number of queries N per batch'),
                  'optim.base_batch': (128, 'LB:126', 'lr_factor = batch_size / 128'),
                  'optim.momentum': (0.9, 'LB:353', 'momentum=0.9,'),
                  'optim.weight_decay': (0.0005, 'LB:354', 'weight_decay=5e-4,'),
                  'optim.nesterov': (False, 'LB:350', None),
                  'schedule.name': ('cosine', 'LB:356', 'CosineAnnealingLR(optim, max_epochs)'),
                  'schedule.warmup_epochs': (10,
                                             'EqCo:172',
                                             'we introduce a warm-up stage at the beginning of the training, which follows ... '
                                             'SimCLR'),
                  'schedule.milestones': ([], 'unused with cosine', None),
                  'schedule.gamma': (0.1, 'unused with cosine', None),
                  'epochs': (200, 'EqCo:188', '200'),
                  'batch_size': (512, 'LB:28', '| Moco (*) | 512 | 200 | 0.847 |'),
                  'precision': ('auto', 'cl-zoo default', None),
                  'sync_bn': (False, 'single GPU', None),
                  'knn_every': (10, 'cl-zoo online kNN monitor', None)}}

LIGHTLY_RECIPES = ("dcl_cifar10", "dclw_cifar10", "simclr_cifar10", "mocov2_cifar10")


def _commented_values(path: Path) -> dict[str, tuple[Any, str]]:
    """``{dotted key: (value, comment)}`` for every value line of a recipe (2-space YAML, one key a line)."""
    out: dict[str, tuple[Any, str]] = {}
    stack: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        code, _, comment = line.partition("#")
        key, _, value = code.strip().partition(":")
        stack = stack[: (len(line) - len(line.lstrip())) // 2]
        if not value.strip():
            stack.append(key)
            continue
        dotted = ".".join([*stack, key])
        if dotted not in ("method", "model_args"):
            out[dotted] = (yaml.safe_load(value.strip()), comment.strip())
    return out


def _lookup(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def test_every_cifar10_recipe_is_in_the_table() -> None:
    assert sorted(p.stem for p in RECIPES_DIR.glob("*cifar10*.yaml")) == sorted(SOURCES)


def assert_values_are_their_quoted_sources(name: str, table: dict[str, tuple[Any, str, str | None]],
                                           table_name: str) -> None:
    """Recipe ``name``'s commented keys are exactly ``table``'s rows, each loading as its value, its comment
    starting with where the value comes from and quoting the source's text."""
    path = RECIPES_DIR / f"{name}.yaml"
    in_file = _commented_values(path)
    assert sorted(in_file) == sorted(table), f"{name}: keys without a row in {table_name}, or rows for keys no longer there"
    loaded = Recipe.load(path).to_dict()
    for key, (value, where, quote) in table.items():
        assert _lookup(loaded, key) == value, f"{name}: {key} is {_lookup(loaded, key)!r}, its source says {value!r}"
        comment = in_file[key][1]
        assert comment.startswith(where), f"{name}: {key}'s comment no longer cites {where!r}: {comment!r}"
        if quote is not None:
            assert f'"{quote}"' in comment, f"{name}: {key}'s comment no longer quotes {quote!r}"


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_recipe_values_are_their_quoted_sources(name: str) -> None:
    assert_values_are_their_quoted_sources(name, SOURCES[name], "SOURCES")


@pytest.mark.parametrize("name", LIGHTLY_RECIPES)
def test_lightly_recipes_train_as_lightlys_benchmark(name: str) -> None:
    """Peak lr 6e-2 x 512/128, no warm-up, and weight decay on every trainable parameter (BN and biases too)."""
    recipe = Recipe.load(name)
    assert recipe.effective_lr == pytest.approx(0.24)
    assert recipe.schedule.warmup_epochs == 0
    method = build_method_from_recipe(recipe)
    groups = method.parameter_groups(recipe.optim.weight_decay)
    trainable = [p for p in method.parameters() if p.requires_grad]
    decayed = [p for g in groups if g["params"] and g["weight_decay"] == 5e-4 for p in g["params"]]
    assert len(decayed) == len(trainable) and any(p.ndim == 1 for p in decayed)


def test_lightlys_defaults_are_the_ones_quoted() -> None:
    """The package defaults the lightly recipes quote, read from the installed lightly (skipped without it)."""
    lightly_loss = pytest.importorskip("lightly.loss")
    from lightly.models.modules import heads
    from lightly.transforms import SimCLRTransform

    def default(fn: Any, arg: str) -> Any:
        return inspect.signature(fn).parameters[arg].default

    assert default(lightly_loss.DCLLoss.__init__, "temperature") == SOURCES["dcl_cifar10"]["method_args.temperature"][0]
    assert default(lightly_loss.DCLWLoss.__init__, "temperature") == SOURCES["dclw_cifar10"]["method_args.temperature"][0]
    assert default(lightly_loss.DCLWLoss.__init__, "sigma") == SOURCES["dclw_cifar10"]["method_args.sigma"][0]
    assert default(lightly_loss.NTXentLoss.__init__, "temperature") == SOURCES["simclr_cifar10"]["method_args.temperature"][0]
    assert default(heads.SimCLRProjectionHead.__init__, "num_layers") == 2
    assert default(heads.SimCLRProjectionHead.__init__, "batch_norm") is True
    assert default(heads.MoCoProjectionHead.__init__, "batch_norm") is False
    # SimCLRTransform(input_size=32, cj_strength=0.5, gaussian_blur=0.0) is our "cifar" preset's jitter and crop
    from cl_zoo.data.augment import preset

    cifar = preset("cifar", 32)
    s = 0.5
    assert (cifar.brightness, cifar.contrast, cifar.saturation, cifar.hue) == pytest.approx(
        (default(SimCLRTransform.__init__, "cj_bright") * s, default(SimCLRTransform.__init__, "cj_contrast") * s,
         default(SimCLRTransform.__init__, "cj_sat") * s, default(SimCLRTransform.__init__, "cj_hue") * s))
    assert cifar.jitter_p == default(SimCLRTransform.__init__, "cj_prob")
    assert cifar.scale[0] == default(SimCLRTransform.__init__, "min_scale")
    assert cifar.grayscale_p == default(SimCLRTransform.__init__, "random_gray_scale")
    assert cifar.flip_p == default(SimCLRTransform.__init__, "hf_prob") and cifar.blur_p == 0.0
