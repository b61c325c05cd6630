/**
 * Checks of what `space bench` writes, shared by the suite's tests: the JSON document against its
 * schema, and the plot as well-formed SVG.
 */
import { Ajv } from 'ajv';
import { XMLValidator } from 'fast-xml-parser';
import { BenchDocumentSchema } from './report.ts';

/** True when `doc` is a valid JSON document of a bench command (see report.ts). */
export const validateDocument = new Ajv({ strict: false }).compile(BenchDocumentSchema);

/** True when `svg` is well-formed XML whose root element is `<svg>`. */
export function isSvg(svg: string): boolean {
  return XMLValidator.validate(svg) === true && /^<svg[\s>]/.test(svg);
}
