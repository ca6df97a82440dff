// BoundedFrequencyRunner with a fake clock: coalescing, the minimum and maximum interval, retries.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {BoundedFrequencyRunner, type RunReason} from '../../../src/agent/sync/runner.ts';
import {FakeClock} from '../fake-clock.ts';

function setup(options: {min?: number; max?: number; retry?: number; retryBase?: number; fail?: () => boolean; duration?: number} = {}) {
  const clock = new FakeClock();
  const start = clock.now();
  const runs: Array<{at: number; reason: RunReason}> = [];
  const errors: number[] = [];
  const runner = new BoundedFrequencyRunner(
    async (reason) => {
      runs.push({at: clock.now() - start, reason});
      if (options.duration) await new Promise<void>((resolve) => clock.setTimer(resolve, options.duration!));
      if (options.fail?.()) throw new Error('iptables-restore: exit 1');
    },
    {
      minInterval: options.min ?? 1000,
      maxInterval: options.max ?? 30_000,
      retryInterval: options.retry ?? 30_000,
      retryBase: options.retryBase,
      clock,
      onError: (_e, delay) => errors.push(delay),
    },
  );
  runner.start();
  return {clock, runner, runs, errors, at: () => runs.map((run) => run.at)};
}

test('the first request runs at once', async () => {
  const {clock, runner, runs} = setup();
  runner.run();
  await clock.advance(0);
  assert.deepEqual(runs, [{at: 0, reason: {requested: true, periodic: false, retry: false}}]);
});

test('a burst of requests inside minInterval coalesces into one more run, at minInterval', async () => {
  const {clock, runner, at} = setup({min: 1000});
  runner.run();
  await clock.advance(100);
  for (let i = 0; i < 50; i++) {
    runner.run();
    await clock.advance(10);
  }
  await clock.advance(5000);
  assert.deepEqual(at(), [0, 1000]);
});

test('minInterval counts from the end of the previous run', async () => {
  const {clock, runner, at} = setup({min: 1000, duration: 400});
  runner.run();
  await clock.advance(10);
  runner.run();
  await clock.advance(3000);
  assert.deepEqual(at(), [0, 1400]);
});

test('a request during a run is not lost', async () => {
  const {clock, runner, at} = setup({min: 0, duration: 500});
  runner.run();
  await clock.advance(100);
  runner.run();
  await clock.advance(2000);
  assert.deepEqual(at(), [0, 500]);
});

test('without requests it runs once per maxInterval, marked periodic', async () => {
  const {clock, runs} = setup({max: 30_000});
  await clock.advance(95_000);
  assert.deepEqual(
    runs.map((run) => run.at),
    [30_000, 60_000, 90_000],
  );
  assert.ok(runs.every((run) => run.reason.periodic && !run.reason.requested));
});

test('a requested run pushes the periodic one back', async () => {
  const {clock, runner, at} = setup({max: 30_000});
  await clock.advance(20_000);
  runner.run();
  await clock.advance(40_000);
  assert.deepEqual(at(), [20_000, 50_000]);
});

test('a failure is retried with a doubling backoff up to retryInterval, then reset by success', async () => {
  let failuresLeft = 5;
  const {clock, runner, runs, errors} = setup({min: 1000, max: 600_000, retry: 8000, fail: () => failuresLeft-- > 0});
  runner.run();
  await clock.advance(60_000);
  assert.deepEqual(errors, [1000, 2000, 4000, 8000, 8000]);
  assert.deepEqual(
    runs.map((run) => run.at),
    [0, 1000, 3000, 7000, 15_000, 23_000],
  );
  assert.ok(runs.slice(1).every((run) => run.reason.retry));
  await clock.advance(600_000);
  assert.equal(runs.length, 7, 'after success only the periodic run follows');
});

test('a request during a backoff runs at minInterval, not at the retry time', async () => {
  let failuresLeft = 1;
  const {clock, runner, runs} = setup({min: 1000, retry: 30_000, retryBase: 10_000, fail: () => failuresLeft-- > 0});
  runner.run();
  await clock.advance(500);
  runner.run();
  await clock.advance(5000);
  assert.deepEqual(runs, [
    {at: 0, reason: {requested: true, periodic: false, retry: false}},
    {at: 1000, reason: {requested: true, periodic: false, retry: false}},
  ]);
});

test('stop cancels what is scheduled', async () => {
  const {clock, runner, runs} = setup({max: 1000});
  await runner.stop();
  runner.run();
  await clock.advance(10_000);
  assert.equal(runs.length, 0);
  assert.equal(clock.pendingTimers, 0);
});

test('nothing runs before start', async () => {
  const clock = new FakeClock();
  let runs = 0;
  const runner = new BoundedFrequencyRunner(async () => void runs++, {minInterval: 0, maxInterval: 10, retryInterval: 10, clock});
  runner.run();
  await clock.advance(100);
  assert.equal(runs, 0);
  runner.start();
  await clock.advance(0);
  assert.equal(runs, 1);
});

test('maxInterval shorter than minInterval is refused', () => {
  assert.throws(
    () => new BoundedFrequencyRunner(async () => {}, {minInterval: 10, maxInterval: 5, retryInterval: 5}),
    /maxInterval 5 ms is shorter than minInterval 10 ms/,
  );
});
