// What pods/log reads: the log of a container, kept by whoever runs it (the lab's kubelets).

/** One line a container wrote, with when. */
export interface LogLine {
  time: string;
  text: string;
}

export interface ContainerLog {
  lines: LogLine[];
  /** follow calls onLine for every new line until the container ends (onEnd) or the returned function is called. */
  follow(onLine: (line: LogLine) => void, onEnd: () => void): () => void;
}

/** PodLogSource: where a container's log is (the kubelet that runs it), or undefined when none runs it. */
export interface PodLogSource {
  open(namespace: string, pod: string, container: string, previous: boolean): ContainerLog | undefined;
}
