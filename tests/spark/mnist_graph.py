"""The issue's softmax regression, shared by the Spark tests (plain values only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Softmax:
    graph: Any
    sess: Any
    x: Any
    y: Any
    y_: Any
    W: Any
    b: Any
    loss: Any
    train_step: Any
    accuracy: Any

    def test_accuracy(self, images: np.ndarray, labels_one_hot: np.ndarray) -> float:
        return float(
            self.sess.run(self.accuracy, feed_dict={self.x: images, self.y_: labels_one_hot})
        )


def softmax_regression(learning_rate: float = 0.1) -> Softmax:
    """Exactly the code of the issue (in its own graph), with the learning rate as a knob."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 784])
        W = tf.Variable(tf.zeros([784, 10]))
        b = tf.Variable(tf.zeros([10]))
        y = tf.nn.softmax(tf.matmul(x, W) + b)
        y_ = tf1.placeholder(tf.float32, [None, 10])
        cross_entropy = tf.reduce_mean(-tf.reduce_sum(y_ * tf1.log(y + 1e-10), axis=[1]))
        train_step = tf1.train.GradientDescentOptimizer(learning_rate).minimize(cross_entropy)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(y, 1), tf.argmax(y_, 1)), tf.float32))
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return Softmax(graph, sess, x, y, y_, W, b, cross_entropy, train_step, accuracy)
